"""Small value types shared by the Delta backends."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

__all__ = ["GUARD_PREFIX", "AppTxn", "Cluster", "Commit", "DataFile"]

# App ids of the guard transactions that make two racing replacements conflict (not input versions:
# readers of app transactions skip them).
GUARD_PREFIX = "spark_jobs."


@dataclass(frozen=True)
class AppTxn:
    """A Delta app transaction: ``app_id`` consumed its input up to ``version``."""

    app_id: str
    version: int


@dataclass(frozen=True)
class Cluster:
    """How a rewrite lays out its rows: up to ``files`` files by ``column``. ``range`` keeps each
    file's values contiguous; ``hash`` needs no sampling pass, for small frequent rewrites. Rows at or past
    ``tail_from`` (by range), which later rewrites may still replace, get one file of their own."""

    column: str
    files: int
    by: Literal["range", "hash"] = "range"
    tail_from: datetime | None = None


@dataclass(frozen=True)
class Commit:
    """What one write did; ``version`` is the table version it produced."""

    version: int | None
    rows_added: int = 0


@dataclass(frozen=True)
class DataFile:
    """One data file of a snapshot: path relative to the table root."""

    path: str
    size: int
    num_records: int | None
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
