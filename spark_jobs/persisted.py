"""Persisted frames that later steps plan from the cache alone. A classic session analyses each new DataFrame's whole
plan, and a persisted frame's plan still holds its lineage, so every step after it analysed again the joins and windows
before it: most of a small stream merge's time. Under Spark Connect the server plans, and the frame is kept as it is.
The level is Spark's default for frames, memory and disk with the column batches kept as they are: serialising them
again took a session batch's served values a second per million rows."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["persisted"]


def persisted(df: DataFrame) -> DataFrame:
    """``df`` persisted and planned from its cached relation, a leaf; its ``unpersist`` releases the cache."""
    df = df.persist()
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
