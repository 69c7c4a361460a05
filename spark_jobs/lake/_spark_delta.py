"""delta-spark backend: writes and MERGEs through the Delta Lake Spark jars.

Selected where the jars are on the classpath (a cluster, the docker image). Table metadata (versions, app
transactions, file lists) is still read with delta-rs, which reads any Delta table; data goes through Spark's
``delta`` format, so deletion vectors and column mapping written by other engines are honoured.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_type

from spark_jobs._failpoints import failpoint
from spark_jobs.errors import ConflictError
from spark_jobs.key_match import join_on_keys
from spark_jobs.lake._embedded import EmbeddedLake
from spark_jobs.lake._types import AppTxn, Cluster, Commit

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, DataFrameWriter

__all__ = ["SparkDeltaLake"]


# delta-spark's optimistic-concurrency failures (io.delta.exceptions / delta.exceptions)
_CONFLICTS = ("ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException",
              "ConcurrentTransactionException", "ConcurrentWriteException", "MetadataChangedException",
              "ProtocolChangedException", "ConcurrentModificationException")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@contextmanager
def _conflicts(path: str) -> Iterator[None]:
    """Delta's concurrent-modification exceptions, as the :class:`ConflictError` the jobs retry."""
    try:
        yield
    except (PySparkException, Py4JJavaError) as exc:  # how Delta's JVM exceptions reach Python
        if any(name in f"{type(exc).__name__}: {exc}" for name in _CONFLICTS):
            raise ConflictError(f"commit to Delta table {path} lost to a concurrent writer: {exc}") from exc
        raise


class SparkDeltaLake(EmbeddedLake):
    name = "delta-spark"
    commits_on_driver = False  # its commits are Spark jobs (MERGE)

    def read(self, path: str, *, version: int | None = None,
             partitions: Sequence[tuple[str, str, Any]] | None = None) -> DataFrame:
        df = self.spark.read.format("delta").options(**({} if version is None else {"versionAsOf": version})).load(path)
        for col, op, value in partitions or ():
            df = df.where(f"`{col}` {op} {_quote(str(value))}")
        return df

    def missing_files(self, path: str, files: Sequence[str]) -> list[str]:
        jvm = self.spark.sparkContext._jvm
        assert jvm is not None
        conf = self.spark.sparkContext._jsc.hadoopConfiguration()
        targets = [(f, jvm.org.apache.hadoop.fs.Path(f"{path.rstrip('/')}/{f}")) for f in files]
        return [f for f, target in targets if not target.getFileSystem(conf).exists(target)]

    def _writer(self, df: DataFrame, mode: str, partition_by: Sequence[str], app_txn: AppTxn | None,
                metadata: Mapping[str, Any] | None) -> DataFrameWriter:
        writer = df.write.format("delta").mode(mode)
        writer = writer.partitionBy(*partition_by) if partition_by else writer
        writer = writer.option("txnAppId", app_txn.app_id).option("txnVersion", app_txn.version) if app_txn else writer
        return writer.option("userMetadata", json.dumps(dict(metadata), default=str)) if metadata else writer

    def _done(self, path: str) -> Commit:
        failpoint(f"commit:{Path(path).name}:after")
        return Commit(self.version(path))

    def _save(self, writer: DataFrameWriter, path: str) -> Commit:
        failpoint(f"commit:{Path(path).name}:before")
        with _conflicts(path):
            writer.save(path)
        return self._done(path)

    def _unmoved(self, path: str, read_version: int | None, what: str) -> int | None:
        """The table's version; :class:`ConflictError` when it is no longer ``read_version``, the one planned from."""
        current = self.version(path)
        if read_version is not None and current != read_version:
            raise ConflictError(f"Delta table {path} moved from version {read_version} to {current} while "
                                f"this job planned its {what}")
        return current

    def _df(self, data: DataFrame | pa.Table) -> DataFrame:
        """Driver-held Arrow rows go through Spark here: MERGE and the Delta writer need a DataFrame."""
        return self.spark.createDataFrame(data) if isinstance(data, pa.Table) else data

    def _check_spec(self, path: str) -> None:
        """delta-spark commits carry one app transaction: the spec version is checked before the write
        instead of carried by it (a race with ``apply`` inside that window is not caught here)."""
        self._check_target(self.table(path), path, pa.schema([]), (), overwrite=True)

    def append(self, df: DataFrame | pa.Table, path: str, *, partition_by: Sequence[str] = (),
               app_txn: AppTxn | None = None, metadata: Mapping[str, Any] | None = None,
               conform: bool = False, read_version: int | None = None) -> Commit:
        df = self._df(self._conform(df, path, conform))
        self._check_spec(path)
        if read_version is not None:
            self._unmoved(path, read_version, "append")
        return self._save(self._writer(df, "append", partition_by, app_txn, metadata), path)

    def rewrite(self, rows: DataFrame | pa.Table, path: str, *, partition_by: Sequence[str] = (),
                read_version: int | None = None, app_txns: Sequence[AppTxn] = (),
                metadata: Mapping[str, Any] | None = None, sort_by: Sequence[str] = (),
                cluster: Cluster | None = None) -> Commit:
        """An overwrite that may change the columns. Only the first app transaction (the spec version) is
        recorded: without the others, the next reduce or rollup refresh merges everything once."""
        self._unmoved(path, read_version, "rewrite")
        writer = self._writer(self._df(rows), "overwrite", partition_by, app_txns[0] if app_txns else None, metadata)
        return self._save(writer.option("overwriteSchema", "true"), path)

    def add_columns(self, path: str, fields: Sequence[pa.Field], *, app_txns: Sequence[AppTxn] = ()) -> Commit:
        have = set((self.schema(path) or pa.schema([])).names)
        if new := [f for f in fields if f.name not in have]:
            columns = ", ".join(f"`{f.name}` {from_arrow_type(f.type).simpleString()}" for f in new)
            with _conflicts(path):
                self.spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
        if app_txns:  # an empty commit records the spec version
            empty = self.spark.createDataFrame([], self.read(path).schema)
            with _conflicts(path):
                self._writer(empty, "append", (), app_txns[0], None).save(path)
        return self._done(path)

    def replace_partition(self, df: DataFrame | pa.Table, path: str, *, partition_by: Sequence[str],
                          partition: Mapping[str, str], metadata: Mapping[str, Any] | None = None,
                          conform: bool = False) -> Commit:
        df = self._df(self._conform(df, path, conform))
        where = " AND ".join(f"`{k}` = {_quote(v)}" for k, v in partition.items())
        self._check_spec(path)
        writer = self._writer(df, "overwrite", partition_by, None, metadata)
        return self._save(writer.option("replaceWhere", where), path)

    def replace_keys(self, rows: DataFrame | pa.Table, path: str, *, keys: Sequence[str],
                     touched: DataFrame | pa.Table | None, app_txn: AppTxn | None = None,
                     metadata: Mapping[str, Any] | None = None, sort_by: Sequence[str] = (),
                     cluster: Cluster | None = None, prune: tuple[str, Any, Any] | None = None,
                     read_version: int | None = None) -> Commit:
        """MERGE reads the latest snapshot: a job that planned from an older one (``read_version``)
        conflicts up front; Delta's own checks cover commits after the MERGE's snapshot."""
        from delta.tables import DeltaTable

        rows = self._df(rows)
        current = self._unmoved(path, read_version, "write")
        self._check_spec(path)
        if current is None:
            return self.append(rows, path, app_txn=app_txn, metadata=metadata)
        if touched is None:
            return self._save(self._writer(rows, "overwrite", (), app_txn, metadata), path)
        touched = self._df(touched)
        source = join_on_keys(touched.select(*keys).distinct(), rows.withColumn("_present", F.lit(True)), keys, "left")
        cond = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in keys)
        columns: dict[str, str | Column] = {c: f"s.`{c}`" for c in rows.columns}
        conf = self.spark.conf
        if app_txn:
            conf.set("spark.databricks.delta.write.txnAppId", app_txn.app_id)
            conf.set("spark.databricks.delta.write.txnVersion", str(app_txn.version))
        if metadata:
            conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps(dict(metadata), default=str))
        failpoint(f"commit:{Path(path).name}:before")
        with _conflicts(path):
            try:
                (DeltaTable.forPath(self.spark, path).alias("t").merge(source.alias("s"), cond)
                 .whenMatchedDelete(condition="s._present IS NULL").whenMatchedUpdate(set=columns)
                 .whenNotMatchedInsert(condition="s._present IS NOT NULL", values=columns).execute())
            finally:
                for key in ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion",
                            "spark.databricks.delta.commitInfo.userMetadata"):
                    conf.unset(key)
        return self._done(path)

    def append_rows(self, table: pa.Table, path: str, *, metadata: Mapping[str, Any] | None = None) -> Commit:
        df = self.spark.createDataFrame(table.to_pandas())
        self._writer(df, "append", (), None, metadata).option("mergeSchema", "true").save(path)
        return Commit(self.version(path), rows_added=table.num_rows)
