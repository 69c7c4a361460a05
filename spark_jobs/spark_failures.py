"""The errors Spark raises when it fails an action, so that callers catch those and not every exception."""

from __future__ import annotations

from functools import cache

__all__ = ["spark_errors"]


@cache
def spark_errors() -> tuple[type[BaseException], ...]:
    """A failed Spark action or plan, classic or Connect (``PySparkException`` and its captured JVM errors), a
    py4j error that PySpark did not convert, and a file error of the driver's own reads. Imported lazily: the
    modules that catch them import no pyspark until Spark runs."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return (PySparkException, Py4JError, OSError)
