"""Embedded Delta backend: Spark executors write Parquet, the driver commits through delta-rs.

No JVM Delta jars are needed. A write goes in three steps: Spark writes the data files in parallel into a
staging folder inside the table, the driver moves them into place and reads only their Parquet footers (for
Delta statistics), then one delta-rs transaction adds them, removes what they replace and records the app
transaction that makes a replay a no-op. A crash before the commit leaves unreferenced files that ``vacuum``
removes; the table itself only ever changes in that one commit.

Concurrent writers: a rewrite commits against the snapshot it was planned from, and every replacement (of a
partition, or of keys) also carries a guard app transaction, so delta-rs refuses the later of two racing
replacements even when neither removed a file the other read. The loser gets a :class:`ConflictError` and
nothing is written. Small writes the driver holds as Arrow tables (a small mini-batch's outputs) skip Spark:
pyarrow writes the files into the same staging folder, and the same commit follows.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction, create_table_with_add_actions

from spark_jobs._failpoints import failpoint
from spark_jobs.durations import utc
from spark_jobs.errors import ConflictError, LakeError, SpecChangedError
from spark_jobs.key_match import join_on_keys, key_mask
from spark_jobs.lake._types import GUARD_PREFIX, AppTxn, Cluster, Commit, DataFile
from spark_jobs.lake.arrow import file_layout, fill_columns
from spark_jobs.lake.tables import is_spec_shaped
from spark_jobs.spark_functions import F

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["EmbeddedLake"]

_STAGING = "_staging"
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# A commit not planned from a snapshot (an append, a partition's replacement) that loses a race is retried
# against the new snapshot with the files it staged, this many times, before the job re-plans.
_COMMIT_TRIES = 4


def _local(path: str) -> str:
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return unquote(parsed.path) if parsed.scheme else path
    raise LakeError(f"the embedded Delta backend writes to local or mounted paths, not {path!r}; for object stores "
                    "run with SPARK_JOBS_DELTA_BACKEND=delta-spark on a cluster with the Delta jars")


def _nullable_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _nullable_type(f.type), nullable=True) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(pa.field(t.value_field.name, _nullable_type(t.value_type), nullable=True))
    return pa.map_(t.key_type, _nullable_type(t.item_type)) if pa.types.is_map(t) else t


def _nullable(schema: pa.Schema) -> pa.Schema:
    """Delta schemas here are nullable all the way down: files read back by Spark are, too."""
    return pa.schema([pa.field(f.name, _nullable_type(f.type), nullable=True) for f in schema])


def _same_columns(a: pa.Schema, b: pa.Schema) -> bool:
    """Same names and types, in any order: readers match columns by name, and a column added to a table
    by a spec change comes last in it, not where a new table would have it."""
    return sorted((f.name, str(f.type)) for f in a) == sorted((f.name, str(f.type)) for f in b)


def _stat_value(value: Any, *, upper: bool) -> Any:
    if isinstance(value, datetime):
        value = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
        if upper and value.microsecond % 1000:
            value = value + timedelta(microseconds=1000 - value.microsecond % 1000)
        value = value.replace(microsecond=value.microsecond - value.microsecond % 1000)
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if isinstance(value, (int, float, str)) else None


def _file_stats(path: str) -> tuple[int, str]:
    """Delta ``stats`` JSON from a Parquet footer (no data pages are read)."""
    meta = pq.read_metadata(path)
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for ci in range(meta.num_columns):
        col_path = meta.schema.column(ci).path
        if "." in col_path:  # nested: Delta wants nested maps; skip rather than guess
            continue
        lo = hi = None
        null_count = 0
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(ci).statistics
            if st is None:  # a row group without statistics: none for the column
                break
            null_count += st.null_count or 0
            if st.has_min_max:
                lo = st.min if lo is None or st.min < lo else lo
                hi = st.max if hi is None or st.max > hi else hi
        else:
            nulls[col_path] = null_count
            lo_v, hi_v = _stat_value(lo, upper=False), _stat_value(hi, upper=True)
            if lo_v is not None and hi_v is not None:
                mins[col_path], maxs[col_path] = lo_v, hi_v
    stats = {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return meta.num_rows, json.dumps(stats, separators=(",", ":"))


def _data_files(dt: DeltaTable) -> list[DataFile]:
    actions = pa.table(dt.get_add_actions(flatten=True))
    part_cols = [c for c in actions.column_names if c.startswith("partition.")]
    return [DataFile(unquote(row["path"]), int(row["size_bytes"]), row["num_records"],
                     {c[len("partition."):]: (None if row[c] is None else str(row[c])) for c in part_cols})
            for row in actions.select(["path", "size_bytes", "num_records", *part_cols]).to_pylist()]


def _overlapping(dt: DeltaTable, column: str, lo: Any, hi: Any) -> list[str]:
    """Data files whose min/max statistics of ``column`` may hold a value in [lo, hi]."""
    lo, hi = (utc(v) for v in (lo, hi))
    actions = pa.table(dt.get_add_actions(flatten=True))
    if f"min.{column}" not in actions.column_names:
        return [unquote(p) for p in actions["path"].to_pylist()]
    stats = zip(*(actions[c].to_pylist() for c in ("path", f"min.{column}", f"max.{column}")), strict=True)
    return [unquote(path) for path, low, high in stats
            if low is None or high is None or (utc(low) <= hi and utc(high) >= lo)]


class EmbeddedLake:
    """Delta tables on a local (or mounted) file system, committed with delta-rs."""

    name = "embedded"
    commits_on_driver = True  # delta-rs commits on the driver, no Spark job

    def __init__(self, spark: SparkSession | None) -> None:
        self._spark = spark  # None: driver-only (Arrow writes, metadata); a Spark read or write then fails
        # the spec version a job runs with (``spec_record.ensure_applied``): its commits to spec-shaped tables carry it
        self.spec_txn: AppTxn | None = None

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            raise LakeError("this Delta lake was opened without Spark: it writes Arrow tables from the driver only")
        return self._spark

    # ---------------------------------------------------------------- metadata
    def table(self, path: str, version: int | None = None) -> DeltaTable | None:
        local = _local(path)
        if not DeltaTable.is_deltatable(local):
            return None
        try:
            return DeltaTable(local, version=version)
        except TableNotFoundError:
            return None
        except (DeltaError, OSError, OverflowError) as exc:  # out of range, cleaned up, corrupt; OverflowError: < 0
            raise LakeError(f"cannot load version {version} of Delta table {path}: {exc}") from exc

    def version(self, path: str) -> int | None:
        return None if (dt := self.table(path)) is None else dt.version()

    def schema(self, path: str) -> pa.Schema | None:
        """The table's columns as Arrow types (what an Arrow write must match), None without a table."""
        return None if (dt := self.table(path)) is None else _nullable(pa.schema(dt.schema().to_arrow()))

    def txn_version(self, path: str, app_id: str, version: int | None = None) -> int | None:
        return None if (dt := self.table(path, version)) is None else dt.transaction_version(app_id)

    def files(self, path: str, version: int | None = None) -> list[DataFile]:
        return [] if (dt := self.table(path, version)) is None else _data_files(dt)

    def missing_files(self, path: str, files: Sequence[str]) -> list[str]:
        """Which of these data files (relative paths) no longer exist, e.g. after VACUUM."""
        root = _local(path)
        return [f for f in files if not os.path.exists(os.path.join(root, f))]

    # ------------------------------------------------------------------- reads
    def read(self, path: str, *, version: int | None = None,
             partitions: Sequence[tuple[str, str, Any]] | None = None) -> DataFrame:
        """The table's snapshot as a DataFrame, read by Spark in parallel from its file list."""
        if (dt := self.table(path, version)) is None:
            raise LakeError(f"no Delta table at {path}; run the job that creates it first (combine, then reduce)")
        unsupported = set(getattr(dt.protocol(), "reader_features", None) or []) & {"deletionVectors", "columnMapping"}
        if unsupported:
            raise LakeError(f"Delta table {path} uses reader features {sorted(unsupported)} that the embedded backend "
                            "cannot read; use the delta-spark backend (SPARK_JOBS_DELTA_BACKEND=delta-spark)")
        return self._read_uris(path, dt, dt.file_uris(partition_filters=list(partitions) if partitions else None))

    def read_files(self, path: str, files: Sequence[str], *, version: int | None = None) -> DataFrame:
        """Rows of some data files of the table (relative paths, as in ``files()``)."""
        if (dt := self.table(path, version)) is None:
            raise LakeError(f"no Delta table at {path}")
        root = _local(path).rstrip("/")
        return self._read_uris(path, dt, [f"{root}/{f}" for f in files])

    def _read_uris(self, path: str, dt: DeltaTable, uris: Sequence[str]) -> DataFrame:
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = pa.schema(dt.schema().to_arrow())
        spark_schema = from_arrow_schema(schema)
        if not uris:
            return self.spark.createDataFrame([], spark_schema)
        root = _local(path).rstrip("/")
        return self.spark.read.schema(spark_schema).option("basePath", root).parquet(*uris).select(*schema.names)

    # ------------------------------------------------------------------ writes
    def append(self, df: DataFrame | pa.Table, path: str, *, partition_by: Sequence[str] = (),
               app_txn: AppTxn | None = None, metadata: Mapping[str, Any] | None = None,
               conform: bool = False, read_version: int | None = None) -> Commit:
        """Add rows. ``conform``: the rows take the table's columns, those they lack as NULL (a log such as
        ``changelog`` keeps the columns of a dropped aggregate for its history). ``read_version``: the append was
        planned from that version, and a concurrent planned writer makes it conflict."""
        return self._commit_df(self._conform(df, path, conform), path, partition_by=partition_by, app_txn=app_txn,
                               metadata=metadata,
                               snapshot="latest" if read_version is None else self.table(path, read_version))

    def _conform(self, df: DataFrame | pa.Table, path: str, conform: bool = True) -> DataFrame | pa.Table:
        """``df`` with the table's columns: NULL for those it lacks, without those the table lacks."""
        if not conform or (schema := self.schema(path)) is None:
            return df
        if isinstance(df, pa.Table):
            return fill_columns(df, schema)
        from pyspark.sql.pandas.types import from_arrow_type

        return df.select(*(F.col(f.name) if f.name in df.columns else F.lit(None).cast(from_arrow_type(f.type)).alias(f.name)
                           for f in schema))

    def rewrite(self, rows: DataFrame | pa.Table, path: str, *, partition_by: Sequence[str] = (),
                read_version: int | None = None, app_txns: Sequence[AppTxn] = (),
                metadata: Mapping[str, Any] | None = None, sort_by: Sequence[str] = (),
                cluster: Cluster | None = None) -> Commit:
        """Replace every row of the table with ``rows``, whose columns may differ from the table's (a spec
        change): one commit against ``read_version``, which a concurrent writer makes conflict."""
        if (snapshot := self.table(path, read_version)) is None:
            raise LakeError(f"no Delta table at {path} to rewrite")
        return self._commit_df(rows, path, partition_by=partition_by, snapshot=snapshot, app_txns=app_txns,
                               metadata=metadata, sort_by=sort_by, cluster=cluster, overwrite=True)

    def add_columns(self, path: str, fields: Sequence[pa.Field], *, app_txns: Sequence[AppTxn] = ()) -> Commit:
        """Add nullable columns, without rewriting a file: the rows already written read them as NULL."""
        if (dt := self.table(path)) is None:
            raise LakeError(f"no Delta table at {path} to add columns to")
        have = set(pa.schema(dt.schema().to_arrow()).names)
        new = [f for f in fields if f.name not in have]
        txns = [Transaction(t.app_id, t.version) for t in app_txns]
        table_name = Path(_local(path)).name
        failpoint(f"commit:{table_name}:before")
        try:
            if new:
                props = CommitProperties(app_transactions=txns or None)
                dt.alter.add_columns(list(DeltaSchema.from_arrow(pa.schema(new)).fields), commit_properties=props)
            elif txns:  # nothing to add: record the app transactions alone
                dt.create_write_transaction([], "append", pa.schema(dt.schema().to_arrow()),
                                            partition_by=list(dt.metadata().partition_columns) or None,
                                            commit_properties=CommitProperties(app_transactions=txns))
        except CommitFailedError as exc:
            raise ConflictError(f"changing the columns of Delta table {path} lost to a concurrent writer: {exc}") from exc
        failpoint(f"commit:{table_name}:after")
        return Commit(DeltaTable(_local(path)).version())

    def replace_partition(self, df: DataFrame | pa.Table, path: str, *, partition_by: Sequence[str],
                          partition: Mapping[str, str], metadata: Mapping[str, Any] | None = None,
                          conform: bool = False) -> Commit:
        """Replace exactly the rows of one partition with ``df`` in one commit (``conform``: see ``append``)."""
        if bad := [k for k in partition if k not in partition_by]:
            raise ValueError(f"{bad} are not partition columns of {path} ({list(partition_by)})")
        return self._commit_df(self._conform(df, path, conform), path, partition_by=partition_by, replace=partition,
                               metadata=metadata)

    def replace_keys(self, rows: DataFrame | pa.Table, path: str, *, keys: Sequence[str],
                     touched: DataFrame | pa.Table | None, app_txn: AppTxn | None = None,
                     metadata: Mapping[str, Any] | None = None, sort_by: Sequence[str] = (),
                     cluster: Cluster | None = None, prune: tuple[str, Any, Any] | None = None,
                     read_version: int | None = None) -> Commit:
        """Copy-on-write upsert: rows whose keys are in ``touched`` are replaced by ``rows``.

        Only the data files holding a touched key are rewritten; keys in ``touched`` that have no row in ``rows``
        disappear from the table. ``touched=None`` replaces the whole table. ``cluster`` lays the written rows out
        in files by a column, so later updates of a narrow range (a backfilled day, the open windows) rewrite few
        files. ``prune=(column, lo, hi)`` promises every touched key has ``lo <= column <= hi``: the files whose
        Delta statistics overlap that range are rewritten, without a scan for touched keys; the others are not read.

        The rewrite is planned from one snapshot (``read_version``, else the latest) and committed against it: a
        concurrent commit that removed files in between fails this one with a :class:`ConflictError` instead of
        leaving a key twice.
        """
        keys = list(keys)
        snapshot = self.table(path, read_version)
        by_path = {} if snapshot is None else {f.path: f for f in _data_files(snapshot)}
        affected, out = list(by_path), rows  # no table, or touched=None: every row is replaced
        if snapshot is not None and touched is not None:
            # clustered by the prune column: the files whose statistics overlap its range are the touched ones
            pruned = _overlapping(snapshot, *prune) if prune is not None else None
            if isinstance(rows, pa.Table):
                assert isinstance(touched, pa.Table)
                affected, out = _merge_keys_arrow(rows, touched, _local(path), keys, affected, pruned)
            else:
                assert not isinstance(touched, pa.Table)
                affected, out = self._merge_keys_spark(rows, touched, path, snapshot.version(), keys, affected, pruned)
        return self._commit_df(out, path, snapshot=snapshot, removes=[by_path[f] for f in affected], app_txn=app_txn,
                               metadata=metadata, sort_by=sort_by, cluster=cluster)

    def _merge_keys_spark(self, rows: DataFrame, touched: DataFrame, path: str, version: int, keys: list[str],
                          files: list[str], affected: list[str] | None) -> tuple[list[str], DataFrame]:
        """Of ``files``, those holding a touched key (``affected`` when known), and ``rows`` with their other rows."""
        touched = touched.select(*keys).distinct()
        if affected is None:
            current = self.read_files(path, files, version=version).select(
                *keys, F.col("_metadata.file_path").alias("_file"))
            hit = [r["_file"] for r in join_on_keys(current, touched, keys, "left_semi").select("_file").distinct().collect()]
            root = Path(_local(path)).resolve()
            affected = [os.path.relpath(_local(unquote(uri)), root) for uri in hit]
        if not affected:
            return affected, rows
        kept = join_on_keys(self.read_files(path, affected, version=version), touched, keys, "left_anti")
        return affected, kept.select(*rows.columns).unionByName(rows)

    def append_rows(self, table: pa.Table, path: str, *, metadata: Mapping[str, Any] | None = None) -> Commit:
        """Append a few driver-side rows (run records); never used for pipeline data."""
        local = _local(path)
        props = CommitProperties(custom_metadata=_meta(metadata))
        write_deltalake(local, table, mode="append", commit_properties=props, schema_mode="merge")
        return Commit(DeltaTable(local).version(), rows_added=table.num_rows)

    # ---------------------------------------------------------------- internal
    def _commit_df(self, df: DataFrame | pa.Table, path: str, *, partition_by: Sequence[str] = (),
                   replace: Mapping[str, str] | None = None, removes: Sequence[DataFile] = (),
                   app_txn: AppTxn | None = None, app_txns: Sequence[AppTxn] = (),
                   metadata: Mapping[str, Any] | None = None, sort_by: Sequence[str] = (), cluster: Cluster | None = None,
                   snapshot: DeltaTable | Literal["latest"] | None = "latest", overwrite: bool = False) -> Commit:
        """Stage the files and commit them in one transaction. A ``snapshot`` (None: the table did not
        exist) is what the write was planned from: it commits against that version, and a table created
        meanwhile is a conflict too. Without one, the latest version after staging is used, a table created
        meanwhile (by a combine of another day) is joined, and a lost race is retried with the same files.
        ``overwrite`` replaces every row and may change the columns (a spec change)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = _nullable(df.schema if isinstance(df, pa.Table) else to_arrow_schema(df.schema, timezone="UTC"))
        name = Path(_local(path)).name
        self._check_target(self.table(path) if isinstance(snapshot, str) else snapshot, path, schema, partition_by,
                           overwrite=overwrite)
        staged = self._stage(file_layout(df, cluster, partition_by, sort_by) if isinstance(df, pa.Table)
                             else _cluster_spark(df, cluster, sort_by), path, partition_by)
        txns = [*([app_txn] if app_txn else []), *app_txns]  # the input versions; on a spec-shaped table, the spec's
        if (spec := self.spec_txn) and is_spec_shaped(path) and all(t.app_id != spec.app_id for t in app_txns):
            txns.append(spec)
        write = _Write(path, name, schema, tuple(partition_by), [a for a, _ in staged], tuple(removes), replace,
                       overwrite, metadata, [Transaction(t.app_id, t.version) for t in txns])
        self._commit_retrying(write, snapshot)
        failpoint(f"commit:{name}:after")
        return Commit(DeltaTable(_local(path)).version(), rows_added=sum(rows for _, rows in staged))

    def _commit_retrying(self, write: _Write, snapshot: DeltaTable | Literal["latest"] | None) -> None:
        """Commit ``write`` against ``snapshot``, or the latest version (retried): see :meth:`_commit_df`."""
        planned = not isinstance(snapshot, str)
        for attempt in range(1, 2 if planned else _COMMIT_TRIES + 1):
            existing = snapshot if not isinstance(snapshot, str) else self.table(write.path)
            self._check_target(existing, write.path, write.schema, write.partition_by, overwrite=write.overwrite)
            failpoint(f"commit:{write.name}:before")
            try:
                self._commit_once(write, existing, now=int(time.time() * 1000), planned=planned)
                return
            except CommitFailedError as exc:
                if planned or attempt == _COMMIT_TRIES:
                    raise ConflictError(f"commit to Delta table {write.path} lost to a concurrent writer: {exc}") from exc
                time.sleep(random.uniform(0, 0.05 * 2 ** attempt))  # re-check and commit against the new snapshot
            except (DeltaError, OSError) as exc:  # a bad table or log, the file system
                raise LakeError(f"commit to Delta table {write.path} failed: {exc}") from exc

    def _commit_once(self, write: _Write, existing: DeltaTable | None, *, now: int, planned: bool) -> None:
        """One delta-rs transaction: create the table, replace a partition or every row, or add and remove files.
        Replacements, and writes planned from a snapshot, carry a guard app transaction (see :func:`_guard`)."""
        guards = [Transaction(_guard(write.replace), now)] if write.replace is not None or planned else []
        props = CommitProperties(custom_metadata=_meta(write.metadata), app_transactions=(write.txns + guards) or None)
        if existing is None and (existing := self._create(write, props, join=not planned)) is None:
            return
        filters = [(k, "=", v) for k, v in write.replace.items()] if write.replace is not None else None
        removes = [RemoveAction(f.path, True, now, f.size, dict(f.partition_values)) for f in write.removes]
        existing.create_write_transaction([*write.adds, *removes],
                                          "overwrite" if write.replace is not None or write.overwrite else "append",
                                          write.schema, partition_by=list(write.partition_by) or None,
                                          partition_filters=filters, commit_properties=props)

    def _check_target(self, existing: DeltaTable | None, path: str, schema: pa.Schema, partition_by: Sequence[str],
                      *, overwrite: bool) -> None:
        """The table takes these columns, and is not at a newer spec version than this job's."""
        if existing is None:
            return
        if self.spec_txn is not None and is_spec_shaped(path):
            at = existing.transaction_version(self.spec_txn.app_id)
            if at is not None and at > self.spec_txn.version:
                raise SpecChangedError(f"Delta table {path} follows spec version {at} of the pipeline, this job "
                                       f"version {self.spec_txn.version}: the spec was changed (`apply`) while it "
                                       "ran, and nothing was written; run the job again with the spec the lake records")
        if overwrite:
            return
        current = _nullable(pa.schema(existing.schema().to_arrow()))
        if not _same_columns(current, schema):
            raise LakeError(f"Delta table {path} has columns {current.names} ({_types(current)}) but the job writes "
                            f"{schema.names} ({_types(schema)}); its spec does not match the table: see "
                            "`python -m spark_jobs plan --pipeline SPEC` and make the change with `apply`")
        if list(existing.metadata().partition_columns) != list(partition_by):
            raise LakeError(f"Delta table {path} is partitioned by {existing.metadata().partition_columns}, "
                            f"expected {list(partition_by)}; remove the table and recompute it")

    def _create(self, write: _Write, props: CommitProperties, *, join: bool) -> DeltaTable | None:
        """Create the table with ``write``'s files and return None; or, when another job created it meanwhile,
        return that table to commit into (``join``: a parallel combine of another day) or conflict."""
        try:
            create_table_with_add_actions(_local(write.path), DeltaSchema.from_arrow(write.schema), write.adds,
                                          mode="error", partition_by=list(write.partition_by) or None,
                                          commit_properties=props)
            return None
        except (DeltaError, OSError):  # the table exists: created since this job looked (else re-raised)
            existing = self.table(write.path)
            if existing is None:
                raise
            if not join:
                raise ConflictError(f"Delta table {write.path} was created by a concurrent writer while this job "
                                    "planned its first write") from None
            return existing

    def _stage(self, df: DataFrame | list[tuple[dict[str, Any], pa.Table]], path: str,
               partition_by: Sequence[str]) -> list[tuple[AddAction, int]]:
        """The rows as Parquet files staged inside the table, those holding rows moved into place: add actions, rows."""
        root = _local(path).rstrip("/")
        staging = f"{root}/{_STAGING}/{uuid.uuid4().hex}"
        if isinstance(df, list):
            _write_arrow(df, staging, partition_by)
        else:
            df.write.mode("error").partitionBy(*partition_by).parquet(staging)
        try:
            files = [os.path.join(d, n) for d, _, names in os.walk(staging) for n in sorted(names)]
            placed = (_place(src, os.path.relpath(src, staging), root) for src in files if src.endswith(".parquet"))
            return [added for added in placed if added is not None]
        finally:
            shutil.rmtree(staging, ignore_errors=True)


@dataclass(frozen=True)
class _Write:
    """What one commit writes: the staged files, the files they replace, and what the commit records."""

    path: str
    name: str  # the table's folder name, in failpoint names
    schema: pa.Schema
    partition_by: tuple[str, ...]
    adds: list[AddAction]
    removes: tuple[DataFile, ...]
    replace: Mapping[str, str] | None  # the partition replaced
    overwrite: bool
    metadata: Mapping[str, Any] | None
    txns: list[Transaction]


def _place(src: str, rel: str, root: str) -> tuple[AddAction, int] | None:
    """Move the staged file ``src`` to ``rel`` under the table ``root``: its add action and rows; None for a
    file without rows (left in staging). The action is built by hand: deltalake 1.6 has no public call that
    describes files another engine wrote (``write_deltalake`` writes its own, ``convert_to_deltalake`` only makes
    a new table), and ``create_write_transaction`` takes each ``AddAction`` ready made, statistics included."""
    num_rows, stats = _file_stats(src)
    if num_rows == 0:
        return None
    dest = os.path.join(root, rel)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    os.replace(src, dest)
    values = {unquote(key): None if unquote(value) == _HIVE_NULL else unquote(value)  # its partition directories'
              for key, value in (part.split("=", 1) for part in rel.split("/")[:-1] if "=" in part)}
    return AddAction(rel, (st := os.stat(dest)).st_size, values, int(st.st_mtime * 1000), True, stats), num_rows


def _guard(partition: Mapping[str, str] | None) -> str:
    """The app id every replacement of the same rows carries: delta-rs fails the later of two concurrent
    commits with one app id, which its file-level checks miss when both only add rows (a partition,
    or new keys, that were empty when both planned)."""
    if partition is None:
        return f"{GUARD_PREFIX}replace_keys"
    return f"{GUARD_PREFIX}replace_partition:" + "/".join(f"{k}={v}" for k, v in sorted(partition.items()))


def _write_arrow(files: list[tuple[dict[str, Any], pa.Table]], staging: str, partition_by: Sequence[str]) -> None:
    """Parquet files as Spark lays them out (Hive-style directories), written on every core (encoding releases the GIL)."""

    def write(values: dict[str, Any], rows: pa.Table) -> None:
        folder = os.path.join(staging, *(f"{col}={_partition_dir(v)}" for col, v in values.items()))
        os.makedirs(folder, exist_ok=True)
        pq.write_table(rows.drop_columns(list(partition_by)), os.path.join(folder, f"part-{uuid.uuid4().hex}.parquet"),
                       compression="snappy")

    with ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, len(files)))) as pool:
        list(pool.map(write, [v for v, _ in files], [t for _, t in files]))


def _partition_dir(value: Any) -> str:
    """A partition value as Spark names its directory (ExternalCatalogUtils.escapePathName)."""
    if value is None:
        return _HIVE_NULL
    text = value.isoformat() if isinstance(value, date) else str(value)
    return "".join(f"%{ord(ch):02X}" if ord(ch) < 0x20 or ch in '"#%\'*/:=?\\\x7f{[]^' else ch for ch in text)


def _cluster_spark(rows: DataFrame, cluster: Cluster | None, sort_by: Sequence[str]) -> DataFrame:
    """The rows in Spark partitions by ``cluster``, each sorted by ``sort_by`` as its file (the driver's: file_layout)."""
    if cluster is not None and cluster.tail_from is not None:  # two partitions at least: Spark plans a union of
        tail = F.coalesce(F.col(cluster.column) >= F.lit(cluster.tail_from), F.lit(False))  # single ones as one
        rows = rows.where(~tail).repartitionByRange(max(2, cluster.files), cluster.column).union(
            rows.where(tail).repartition(1))
    elif cluster is not None:
        rows = (rows.repartition if cluster.by == "hash" else rows.repartitionByRange)(max(1, cluster.files),
                                                                                      cluster.column)
    return rows.sortWithinPartitions(*sort_by) if sort_by else rows


def _merge_keys_arrow(rows: pa.Table, touched: pa.Table, root: str, keys: list[str], files: list[str],
                      affected: list[str] | None) -> tuple[list[str], pa.Table]:
    """Of ``files``, those holding a touched key (``affected`` when known), and ``rows`` with their other rows."""

    def read(file: str, columns: list[str]) -> pa.Table:
        target = pa.schema([rows.schema.field(c) for c in columns])
        try:
            table = pq.read_table(os.path.join(root, file), columns=columns)
        except (pa.ArrowInvalid, KeyError):  # a file from before a column was added: NULL there
            have = set(pq.read_schema(os.path.join(root, file)).names)
            table = pq.read_table(os.path.join(root, file), columns=[c for c in columns if c in have])
        return fill_columns(table, target).cast(target)

    if affected is None:
        affected = [f for f in files if key_mask(read(f, keys), keys, touched).any()] if touched.num_rows else []
    if not affected:
        return affected, rows
    old = pa.concat_tables([read(f, rows.column_names) for f in affected])
    return affected, pa.concat_tables([old.filter(pa.array(~key_mask(old, keys, touched))), rows])


def _meta(metadata: Mapping[str, Any] | None) -> dict[str, str] | None:
    return {k: v if isinstance(v, str) else json.dumps(v, default=str) for k, v in (metadata or {}).items()} or None


def _types(schema: pa.Schema) -> str:
    return ", ".join(str(f.type) for f in schema)
