"""Delta I/O: the only package that reads or commits Delta tables.

Two backends with one interface (:class:`Lake`): ``embedded`` (Spark writes Parquet,
delta-rs commits; the default, needs no JVM jars) and ``delta-spark`` (DeltaTable and MERGE,
chosen automatically when the Delta Lake jars are on Spark's classpath, or by
``SPARK_JOBS_DELTA_BACKEND``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from spark_jobs.lake._types import GUARD_PREFIX, AppTxn, Cluster, Commit, DataFile
from spark_jobs.lake.tables import TABLES, PipelineTables, TableName

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["GUARD_PREFIX", "AppTxn", "Cluster", "Commit", "DataFile", "Lake", "PipelineTables", "TABLES", "TableName", "open_lake"]

BACKENDS: tuple[str, ...] = ("embedded", "delta-spark")


class Lake(Protocol):
    name: str
    commits_on_driver: bool  # its commits are the driver's own work, not Spark jobs: they may run beside Spark's
    spec_txn: AppTxn | None  # set by ``spec_record.ensure_applied``: commits to spec-shaped tables carry it

    def version(self, path: str) -> int | None: ...
    def schema(self, path: str) -> pa.Schema | None: ...
    def txn_version(self, path: str, app_id: str, version: int | None = None) -> int | None: ...
    def files(self, path: str, version: int | None = None) -> list[DataFile]: ...
    def missing_files(self, path: str, files: Sequence[str]) -> list[str]: ...
    def read(self, path: str, *, version: int | None = None,
             partitions: Sequence[tuple[str, str, Any]] | None = None) -> DataFrame: ...
    def read_files(self, path: str, files: Sequence[str], *, version: int | None = None) -> DataFrame: ...
    def append(self, df: DataFrame | pa.Table, path: str, *, partition_by: Sequence[str] = (),
               app_txn: AppTxn | None = None, metadata: Mapping[str, Any] | None = None,
               conform: bool = False, read_version: int | None = None) -> Commit: ...
    def rewrite(self, rows: DataFrame | pa.Table, path: str, *, partition_by: Sequence[str] = (),
                read_version: int | None = None, app_txns: Sequence[AppTxn] = (),
                metadata: Mapping[str, Any] | None = None, sort_by: Sequence[str] = (),
                cluster: Cluster | None = None) -> Commit: ...
    def add_columns(self, path: str, fields: Sequence[pa.Field], *, app_txns: Sequence[AppTxn] = ()) -> Commit: ...
    def replace_partition(self, df: DataFrame | pa.Table, path: str, *, partition_by: Sequence[str],
                          partition: Mapping[str, str], metadata: Mapping[str, Any] | None = None,
                          conform: bool = False) -> Commit: ...
    def replace_keys(self, rows: DataFrame | pa.Table, path: str, *, keys: Sequence[str],
                     touched: DataFrame | pa.Table | None,
                     app_txn: AppTxn | None = None, metadata: Mapping[str, Any] | None = None,
                     sort_by: Sequence[str] = (), cluster: Cluster | None = None,
                     prune: tuple[str, Any, Any] | None = None, read_version: int | None = None) -> Commit: ...
    def append_rows(self, table: pa.Table, path: str, *, metadata: Mapping[str, Any] | None = None) -> Commit: ...


def open_lake(spark: SparkSession | None, backend: str | None = None) -> Lake:
    """The backend named by ``backend`` or ``$SPARK_JOBS_DELTA_BACKEND``, else by classpath. Without a
    session, the embedded backend for Arrow writes from the driver (``apply`` of a small lake)."""
    from spark_jobs.errors import LakeError
    from spark_jobs.lake._embedded import EmbeddedLake
    from spark_jobs.spark_session import delta_jars_available

    if spark is None:
        return EmbeddedLake(None)
    choice = backend or os.environ.get("SPARK_JOBS_DELTA_BACKEND") or "auto"
    if choice not in (*BACKENDS, "auto"):
        raise LakeError(f"unknown Delta backend {choice!r}; use one of auto, {', '.join(BACKENDS)}")
    if choice == "auto":
        choice = "delta-spark" if delta_jars_available(spark) else "embedded"
    if choice == "delta-spark":
        if not delta_jars_available(spark):
            raise LakeError("the delta-spark backend needs the Delta Lake jars on Spark's classpath (io.delta:"
                            "delta-spark_2.13); add them with --jars/--packages or use the embedded backend")
        from spark_jobs.lake._spark_delta import SparkDeltaLake

        return SparkDeltaLake(spark)
    return EmbeddedLake(spark)
