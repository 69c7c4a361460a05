"""Persisted frames that later steps plan from the cache alone. A classic session analyses each new DataFrame's whole
plan, and a persisted frame's plan still holds its lineage, so every step after it analysed again the joins and windows
before it: most of a small stream merge's time. Under Spark Connect the server plans, and the frame is kept as it is."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import StorageLevel
    from pyspark.sql import DataFrame

__all__ = ["persisted"]


def persisted(df: DataFrame, level: StorageLevel | None = None) -> DataFrame:
    """``df`` persisted (at ``level``, else Spark's default) and planned from its cached relation, a leaf; its
    ``unpersist`` releases the cache."""
    df = df.persist(level) if level is not None else df.persist()
    jdf, jvm = getattr(df, "_jdf", None), getattr(df.sparkSession, "_jvm", None)
    if jdf is None or jvm is None:  # a Spark Connect frame
        return df
    return _from_cache()(jvm.org.apache.spark.sql.classic.Dataset.ofRows(
        df.sparkSession._jsparkSession, jdf.queryExecution().withCachedData()), df)


@functools.cache
def _from_cache() -> Any:
    from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

    class FromCache(ClassicFrame):
        def __init__(self, jdf: Any, source: DataFrame) -> None:
            super().__init__(jdf, source.sparkSession)  # type: ignore[arg-type]
            self._source = source  # the frame whose cache this one's plan reads

        def unpersist(self, blocking: bool = False) -> FromCache:
            self._source.unpersist(blocking)
            return self

    return FromCache
