"""Spark's SQL functions as ``F``, imported at their first use: a DAG file's parse imports the window kinds, the
aggregates and the jobs' modules, never pyspark."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import functions as F
else:

    class _Functions:
        def __getattr__(self, name: str) -> Any:
            return getattr(importlib.import_module("pyspark.sql.functions"), name)

    F = _Functions()

__all__ = ["F"]
