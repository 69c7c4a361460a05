"""stream: windowed mini-batch aggregation with keyed state and a retraction changelog, exactly once.

Spark Structured Streaming tracks new landing files; each micro-batch is a mini-batch in
Flink's sense, whose files are read as a batch DataFrame (pruned, vectorised). Its rows are
pre-aggregated per (event day, key, window) first; then each touched key's state is read
once, merged once and written once. State is a Delta table of
the accumulators of open windows (``_stream/state``). Spark's checkpoint
(``_stream/checkpoint``) fixes which files each batch id holds, so a replayed batch sees
the same rows.

A mini-batch commits, in this order, each as one Delta commit carrying the app transaction
(``<pipeline>.stream``, batch id):
1. rejected and late rows to ``dead_letter``;
2. the touched keys' values to ``aggregates`` (first: that is what readers wait for);
3. the changes to ``changelog``;
4. the batch's partial accumulators to ``partials`` (source ``stream``);
5. the new state.
State goes last: a batch with a state commit is complete. A replay skips every table that
already has its commit, so after a kill -9 anywhere, a restart gives the tables of an
uninterrupted run.

Where the state merge runs: a batch that touches few keys (``DRIVER_MAX_KEYS`` after its
pre-aggregation) merges them on the driver with the aggregates' Python algebra and commits
its outputs from Arrow (:mod:`spark_jobs.jobs.stream_driver`), keeping the state of open
windows in memory between batches: planning and scheduling the Spark jobs of a merge costs
seconds, merging a few thousand keys milliseconds. Larger batches, a state too large to
hold, and days that already have a batch combine (the hybrid rule) merge in Spark.

Watermark: the largest event time in state minus ``stream.watermark``, as of the batch's
start. Rows older than it go to ``dead_letter`` as ``late``. Windows ending at or before
it are closed and leave state. Without a window, state is unbounded group aggregation.
"""

from __future__ import annotations

import datetime as dt
import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_jobs.errors import InputError, LakeError, PipelineError
from spark_jobs.jobs.combine import PARTIALS_PARTITIONS, batch_columns, write_dead_letters
from spark_jobs.jobs.landing import CORRUPT, classify, spark_read_error, with_raw
from spark_jobs.jobs.reduce import reduce
from spark_jobs.jobs.runs import new_run_id, recorded_run
from spark_jobs.jobs.stream_driver import merge_on_driver, partial_rows
from spark_jobs.lake import AppTxn, Cluster, DataFile, Lake, PipelineTables, open_lake
from spark_jobs.plan.local import LocalAggregates
from spark_jobs.plan.phases import CompiledAggregates, assign_windows, final_aggregate, partial_aggregate
from spark_jobs.spec import PipelineSpec

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BatchOutcome", "StreamSummary", "app_id", "changelog_rows", "landed_rows", "run", "source_stream"]

log = logging.getLogger("spark_jobs")

DAY = "event_date"
DRIVER_MAX_KEYS = 50_000  # (day, key, window) rows of a pre-aggregated batch merged on the driver
DRIVER_MAX_STATE = 2_000_000  # state rows held in driver memory for it
_FILE_SCHEMA = "path string, modificationTime timestamp, length bigint, content binary"


def app_id(spec: PipelineSpec) -> str:
    return f"{spec.name}.stream"


@dataclass
class BatchOutcome:
    """What one mini-batch did. ``state_writes`` counts (day, key, window) accumulators written."""

    batch_id: int
    rows_in: int = 0
    rows_aggregated: int = 0
    rows_rejected: int = 0
    rows_late: int = 0
    state_writes: int = 0
    changes: int = 0
    watermark: dt.datetime | None = None
    replayed: bool = False
    on_driver: bool = False  # its state merge ran on the driver (few keys), not in Spark
    visible_at: float | None = None  # wall-clock time the aggregates commit landed (latency figures)


@dataclass
class StreamSummary:
    batches: list[BatchOutcome] = field(default_factory=list)
    stopped_by_signal: bool = False

    def summary(self) -> str:
        done = [b for b in self.batches if not b.replayed]
        total = sum(b.rows_in for b in done)
        text = (f"stream: {len(done)} mini-batches, {total:,} rows in, {sum(b.rows_aggregated for b in done):,} "
                f"aggregated, {sum(b.rows_rejected for b in done):,} rejected ({sum(b.rows_late for b in done):,} "
                f"late), {sum(b.state_writes for b in done):,} state writes, {sum(b.changes for b in done):,} "
                f"changelog rows; {sum(b.on_driver for b in done)} of the batches merged on the driver")
        skipped = len(self.batches) - len(done)
        if skipped:
            text += f"; {skipped} replayed batches were already committed"
        return text + ("; stopped by signal at a batch boundary" if self.stopped_by_signal else "")


def source_stream(spark: SparkSession, spec: PipelineSpec) -> DataFrame:
    """New landing files as a stream of their paths (``path``), ``stream.max_files_per_batch`` a batch.

    The stream carries file names only: ``foreachBatch`` hands its function a DataFrame that
    is an already-planned RDD, which Spark can neither prune nor scan with its vectorised
    readers. Each mini-batch reads its files as an ordinary batch DataFrame instead.
    """
    import os

    if not os.path.isdir(spec.source.path) and "://" not in spec.source.path:
        raise InputError(f"landing directory {spec.source.path} does not exist; create it or fix source.path "
                         "(python -m spark_jobs generate writes sample data)")
    return (spark.readStream.format("binaryFile").schema(_FILE_SCHEMA)  # "content" is pruned: never read
            .option("maxFilesPerTrigger", spec.stream.max_files_per_batch).load(spec.source.path).select("path"))


def landed_rows(reader: Any, spec: PipelineSpec, paths: list[str] | None) -> DataFrame:
    """Landing rows through a ``spark.read`` (of ``paths``) or ``spark.readStream`` (of
    ``source.path``, ``paths=None``) reader: spec columns as read, ``_raw``, ``_file`` and
    ``event_date`` (from the file's partition directory)."""
    if spec.source.format == "parquet":
        columns = [f"`{c}` {t}" for c, t in spec.source.schema]
    else:
        columns = [f"`{c}` string" for c, _ in spec.source.schema] + [f"`{CORRUPT}` string"]
    reader = reader.schema(", ".join([*columns, f"{DAY} string"])).option("basePath", spec.source.path)
    target = spec.source.path if paths is None else paths
    if spec.source.format == "json":
        df = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT).json(target)
    elif spec.source.format == "csv":  # columns by position, in the spec's order, after a header line
        df = (reader.option("header", True).option("mode", "PERMISSIVE")
              .option("columnNameOfCorruptRecord", CORRUPT).csv(target))
    else:
        df = reader.parquet(target) if paths is None else reader.parquet(*target)
    return with_raw(df, spec, DAY)


def changelog_rows(before: DataFrame, after: DataFrame, first_seen: DataFrame, compiled: CompiledAggregates,
                   batch_id: int) -> DataFrame:
    """Pure transform: each key's values before and after a batch -> its +I/-U/+U/-D rows.

    A new key gives ``+I``; a changed key ``-U`` (old values) then ``+U`` (new values); a key
    whose row count falls to zero ``-D``; an unchanged key nothing. A key that is missing or
    has a row count of zero does not exist. ``seq`` orders the rows within the batch: keys by
    their first event in the batch, then by key.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = list(compiled.spec.key_columns)
    names = compiled.value_names
    old = before.select(*keys, F.struct(*names, "n_rows").alias("_old"))
    new = after.select(*keys, F.struct(*names, "n_rows").alias("_new"))
    both = old.join(new, keys, "full_outer").join(first_seen, keys, "left")
    same = F.lit(True)
    for name in names:
        same = same & F.col(f"_old.{name}").eqNullSafe(F.col(f"_new.{name}"))

    def entry(op: str, order: int, values: str) -> Any:
        return F.struct(F.lit(op).alias("op"), F.lit(order).alias("_order"),
                        *(F.col(f"{values}.{n}").alias(n) for n in names))

    was = F.col("_old").isNotNull() & (F.col("_old.n_rows") != 0)
    gone = F.col("_new").isNull() | (F.col("_new.n_rows") == 0)
    ops = (F.when(~was & ~gone, F.array(entry("+I", 0, "_new")))
           .when(was & gone, F.array(entry("-D", 0, "_old")))
           .when(was & ~same, F.array(entry("-U", 0, "_old"), entry("+U", 1, "_new")))
           .otherwise(F.array()))
    rows = both.select(*keys, "_first_seen", F.explode(ops).alias("_c")).select(*keys, "_first_seen", "_c.*")
    order = Window.orderBy(F.col("_first_seen").asc_nulls_last(), *keys, "_order")
    return rows.select("op", *keys, *names, F.lit(batch_id).cast("bigint").alias("batch_id"),
                       (F.row_number().over(order) - 1).cast("bigint").alias("seq"))


class MiniBatchAggregator:
    """The ``foreachBatch`` function: one mini-batch in, five atomic commits out (see module doc)."""

    def __init__(self, spark: SparkSession, spec: PipelineSpec, lake: Lake, run_id: str,
                 driver_max_keys: int = DRIVER_MAX_KEYS) -> None:
        self.spark, self.spec, self.lake, self.run_id = spark, spec, lake, run_id
        self.tables = PipelineTables(spec.lake, spec.name)
        self.compiled = CompiledAggregates(spec)
        self.local = LocalAggregates(self.compiled)
        self.driver_max_keys = driver_max_keys
        self._held: tuple[int | None, pa.Table] | None = None  # (state version, its rows) for driver merges
        self.app = app_id(spec)
        self.keys = list(spec.key_columns)
        self.state_keys = [DAY, *self.keys]
        self.state_columns = [*self.state_keys, "n_rows", *self.compiled.acc_columns, "max_event_time"]
        self.lock = threading.Lock()
        self.stopping = False
        self.error: BaseException | None = None
        self.outcomes: list[BatchOutcome] = []
        self._high: dt.datetime | None = None  # largest event time in state, loaded lazily
        self._high_loaded = False

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        with self.lock:
            if self.stopping:  # the query stops before this batch; a restart replays it
                raise _Stopped()
            try:
                self.outcomes.append(self.process(df, batch_id))
            except BaseException as exc:
                self.error = exc
                raise

    # ------------------------------------------------------------------ state
    def _state(self) -> DataFrame | None:
        if self.lake.version(self.tables.stream_state) is None:
            return None
        return self.lake.read(self.tables.stream_state)

    def _watermark(self, high: dt.datetime | None) -> dt.datetime | None:
        if self.spec.window is None or high is None:
            return None
        return high - dt.timedelta(seconds=self.spec.stream.watermark.seconds)

    def _load_high(self, state: DataFrame | None) -> dt.datetime | None:
        from pyspark.sql import functions as F

        if not self._high_loaded:
            row = state.agg(F.max("max_event_time").alias("m")).first() if state is not None else None
            self._high = _utc(row["m"]) if row is not None and row["m"] is not None else None
            self._high_loaded = True
        return self._high

    # ------------------------------------------------------------------ batch
    def process(self, landed: DataFrame, batch_id: int) -> BatchOutcome:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        spec, lake, t = self.spec, self.lake, self.tables
        done = lake.txn_version(t.stream_state, self.app)
        if done is not None and done >= batch_id:
            log.info("mini-batch %d is already committed (state at %d): skipped", batch_id, done)
            return BatchOutcome(batch_id, replayed=True)
        files = sorted(r["path"] for r in landed.collect())
        if not files:
            return BatchOutcome(batch_id)
        txn = AppTxn(self.app, batch_id)
        batch = f"stream-{batch_id}"
        outcome = BatchOutcome(batch_id)
        with recorded_run(lake, t, job="stream", batch=batch, run_id=f"{self.run_id}-{batch_id}") as record:
            record.inputs = files
            df = landed_rows(self.spark.read, spec, files)
            state = self._state()
            record.versions_read = {"stream_state": lake.version(t.stream_state)}
            outcome.watermark = watermark = self._watermark(self._load_high(state))
            et = F.col(spec.source.event_time)
            rows = classify(df, spec, F.col(DAY), DAY)
            late = F.col("_reason").isNull() & (et < F.lit(watermark)) if watermark is not None else F.lit(False)
            rows = rows.withColumn("_late", late).withColumn("_reason", F.coalesce("_reason", F.when(
                F.col("_late"), F.concat(F.lit("late: "), et.cast("string"), F.lit(
                    f" is older than the watermark {watermark or dt.datetime.min:%Y-%m-%d %H:%M:%S} UTC; the batch "
                    "combine of its day counts it")))))
            # Two passes over the batch's files: its rejects (few, cached to count and write) and
            # its pre-aggregation, which also yields the counts and event-time span of valid rows.
            bad = rows.where(F.col("_reason").isNotNull()).persist(StorageLevel.MEMORY_AND_DISK)
            try:
                counts = bad.agg(F.count(F.lit(1)).alias("rejected"),
                                 F.count(F.when(F.col("_late"), 1)).alias("late")).first()
            except Exception as exc:
                raise InputError(f"mini-batch {batch_id} failed reading {spec.source.path}: "
                                 f"{spark_read_error(exc)}") from exc
            assert counts is not None
            outcome.rows_rejected, outcome.rows_late = int(counts["rejected"]), int(counts["late"])
            written: dict[str, int | None] = {}
            dead = write_dead_letters(lake, t, bad, job="stream", batch=batch, run_id=record.run_id,
                                      rejected=outcome.rows_rejected)
            if dead is not None:
                written["dead_letter"] = dead.version
            bad.unpersist()
            valid = rows.where(F.col("_reason").isNull()).withColumn(DAY, F.col(DAY).cast("date"))
            # local pre-aggregation: one row per (day, key, window) of the batch
            delta = partial_aggregate(assign_windows(valid, spec), self.compiled, extra_keys=[DAY], extra_aggs=[
                F.max(et).alias("max_event_time"), F.min(et).alias("_first_seen"), F.count(F.lit(1)).alias("_rows")])
            delta = delta.persist(StorageLevel.MEMORY_AND_DISK)
            span = delta.agg(F.sum("_rows").alias("rows"), F.min("_first_seen").alias("low"),
                             F.max("max_event_time").alias("high"), F.count(F.lit(1)).alias("keys")).first()
            assert span is not None
            outcome.rows_aggregated = int(span["rows"] or 0)
            outcome.rows_in = outcome.rows_aggregated + outcome.rows_rejected
            record.rows_in, record.rows_rejected = outcome.rows_in, outcome.rows_rejected
            record.rows_aggregated = outcome.rows_aggregated
            if outcome.rows_aggregated:
                high = max(h for h in (self._high, _utc(span["high"])) if h is not None)
                bounds = (_utc(span["low"]), _utc(span["high"]))
                schemas = self._driver_schemas(int(span["keys"]), bounds)
                if schemas is not None:
                    self._aggregate_on_driver(delta, schemas, batch_id, txn, record.run_id, bounds,
                                              self._watermark(high), outcome, written)
                else:
                    self._aggregate(delta.drop("_rows"), state, batch_id, txn, record.run_id, bounds,
                                    self._watermark(high), outcome, written)
                self._high = high
            delta.unpersist()
            record.versions_written = written
            record.message = (f"mini-batch {batch_id}: {outcome.state_writes} state writes, {outcome.changes} "
                              f"changelog rows, {outcome.rows_late} late"
                              + (f", watermark {watermark:%Y-%m-%d %H:%M:%S}" if watermark else ""))
        return outcome

    def _aggregate(self, delta: DataFrame, state: DataFrame | None, batch_id: int, txn: AppTxn, run_id: str,
                   span: tuple[Any, Any], closes: dt.datetime | None, outcome: BatchOutcome,
                   written: dict[str, int | None]) -> None:
        """Merge the batch's pre-aggregated ``delta`` into state and commit the outputs."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        lake, t, compiled, keys = self.lake, self.tables, self.compiled, self.keys
        touched_days = delta.select(*self.state_keys)
        touched = delta.select(*keys).distinct()
        first_seen = delta.groupBy(*keys).agg(F.min("_first_seen").alias("_first_seen"))
        delta_state = delta.select(*self.state_columns)
        if state is None:
            state = self.spark.createDataFrame([], delta_state.schema)
        # one state read per touched key ...
        key_rows = state.join(touched, keys, "left_semi").persist(StorageLevel.MEMORY_AND_DISK)
        merged = final_aggregate(key_rows.join(touched_days, self.state_keys, "left_semi").unionByName(delta_state),
                                 compiled, extra_keys=[DAY], extra_aggs=[F.max("max_event_time").alias("max_event_time")])
        merged = merged.select(*self.state_columns).persist(StorageLevel.MEMORY_AND_DISK)
        new_key_rows = key_rows.join(touched_days, self.state_keys, "left_anti").unionByName(merged)

        # the touched keys' values before and after, in one aggregation
        sides = key_rows.withColumn("_after", F.lit(False)).unionByName(new_key_rows.withColumn("_after", F.lit(True)))
        values = final_aggregate(sides, compiled, extra_keys=["_after"])
        changes = changelog_rows(values.where(~F.col("_after")).drop("_after"),
                                 values.where(F.col("_after")).drop("_after"), first_seen, compiled, batch_id)
        meta = {"run_id": run_id, "job": "stream", "batch_id": batch_id}
        prune, cluster = self._layout(span)
        if _pending(lake, t.aggregates, txn):
            rows = reduce(self._hybrid_inputs(new_key_rows, touched, prune), compiled, run_id=run_id)
            written["aggregates"] = lake.replace_keys(
                rows, t.aggregates, keys=keys, touched=touched, app_txn=txn, metadata=meta,
                sort_by=self._sort_by, cluster=cluster, prune=prune).version
            outcome.visible_at = time.time()
        if _pending(lake, t.changelog, txn):
            commit = lake.append(changes, t.changelog, app_txn=txn, metadata=meta)
            written["changelog"] = commit.version
            outcome.changes = commit.rows_added
        if _pending(lake, t.partials, txn):
            partial_rows = batch_columns(delta.drop("max_event_time", "_first_seen"), batch=f"stream-{batch_id}",
                                         source="stream", event_date=F.col(DAY), run_id=run_id)
            commit = lake.append(partial_rows, t.partials, partition_by=PARTIALS_PARTITIONS, app_txn=txn,
                                 metadata=meta)
            written["partials"] = commit.version
            outcome.state_writes = commit.rows_added  # one partial row per state row written
        else:
            outcome.state_writes = merged.count()
        # ... and one state write per touched key; closed windows leave
        new_state = state.join(touched_days, self.state_keys, "left_anti").unionByName(merged)
        if closes is not None:
            new_state = new_state.where(F.col("window_end") > F.lit(closes))
        if compiled.retracting:  # every row of that day and key was retracted
            new_state = new_state.where(F.col("n_rows") != 0)
        commit = lake.replace_keys(new_state, t.stream_state, keys=self.state_keys, touched=None, app_txn=txn,
                                   metadata=meta, sort_by=self.state_keys)
        written["stream_state"] = commit.version
        for df in (key_rows, merged):
            df.unpersist()

    @property
    def _sort_by(self) -> list[str]:
        return ["window_start", *self.spec.group_by] if self.spec.window else list(self.spec.group_by)

    def _layout(self, span: tuple[Any, Any]) -> tuple[tuple[str, Any, Any] | None, Cluster | None]:
        """How the batch rewrites ``aggregates``: the window range it touches, and a file per window."""
        window = self.spec.window
        if window is None:
            return None, None
        prune = ("window_start", span[0] - dt.timedelta(seconds=window.size.seconds), span[1])  # starts in (t - size, t]
        # about a file per window: the next batch rewrites only the files of its own windows
        windows = (prune[2] - prune[1]).total_seconds() // (window.slide or window.size).seconds
        return prune, Cluster("window_start", int(windows) + 1, by="hash")

    @staticmethod
    def _batch_days(files: list[DataFile]) -> list[str]:
        """Event days that have a batch combine: their streaming partials no longer count."""
        return sorted({d for f in files if f.partition_values.get("source") == "batch"
                       and (d := f.partition_values.get(DAY)) is not None})

    # ------------------------------------------------------------ driver merge
    def _driver_schemas(self, keys: int, span: tuple[Any, Any]) -> dict[str, pa.Schema] | None:
        """The output tables' schemas when this batch merges on the driver, else None (merge in Spark)."""
        if keys > self.driver_max_keys:
            return None
        t = self.tables
        schemas = {name: self.lake.schema(path) for name, path in (
            ("aggregates", t.aggregates), ("changelog", t.changelog), ("partials", t.partials),
            ("state", t.stream_state))}
        if any(s is None for s in schemas.values()):  # the first batch creates them with Spark's types
            return None
        if sum(f.num_records or 0 for f in self.lake.files(t.stream_state)) > DRIVER_MAX_STATE:
            return None
        days = self._batch_days(self.lake.files(t.partials))
        if days and self.spec.window is not None:  # windows reach at most a day beyond their events
            lo, hi = span[0].date() - dt.timedelta(days=1), span[1].date() + dt.timedelta(days=1)
            days = [d for d in days if lo <= dt.date.fromisoformat(d) <= hi]
        return None if days else {k: s for k, s in schemas.items() if s is not None}

    def _held_state(self, schema: pa.Schema) -> pa.Table:
        """State rows, kept in memory from the last driver merge while the table has not moved on."""
        version = self.lake.version(self.tables.stream_state)
        if self._held is None or self._held[0] != version:
            self._held = (version, self.lake.read(self.tables.stream_state).toArrow().select(schema.names).cast(schema))
        return self._held[1]

    def _aggregate_on_driver(self, delta: DataFrame, schemas: dict[str, pa.Schema], batch_id: int, txn: AppTxn,
                             run_id: str, span: tuple[Any, Any], closes: dt.datetime | None, outcome: BatchOutcome,
                             written: dict[str, int | None]) -> None:
        """``_aggregate`` for few keys: the batch's rows come to the driver, the outputs leave as Arrow."""
        import pyarrow as pa

        lake, t = self.lake, self.tables
        outcome.on_driver = True
        now = dt.datetime.now(dt.UTC)
        rows = delta.toArrow()
        state_schema = schemas["state"]
        first_seen = pa.field("_first_seen", state_schema.field("max_event_time").type)
        batch = rows.select([*state_schema.names, "_first_seen"]).cast(pa.schema([*state_schema, first_seen]))
        result = merge_on_driver(batch, self._held_state(state_schema), self.local, self.keys, schemas=schemas,
                                 batch_id=batch_id, closes=closes, retracting=self.compiled.retracting,
                                 run_id=run_id, now=now)
        meta = {"run_id": run_id, "job": "stream", "batch_id": batch_id}
        prune, cluster = self._layout(span)
        if _pending(lake, t.aggregates, txn):
            written["aggregates"] = lake.replace_keys(
                result.aggregates, t.aggregates, keys=self.keys, touched=result.touched, app_txn=txn, metadata=meta,
                sort_by=self._sort_by, cluster=cluster, prune=prune).version
            outcome.visible_at = time.time()
        if _pending(lake, t.changelog, txn):
            commit = lake.append(result.changelog, t.changelog, app_txn=txn, metadata=meta)
            written["changelog"] = commit.version
            outcome.changes = commit.rows_added
        if _pending(lake, t.partials, txn):
            partials = partial_rows(rows, schemas["partials"], batch=f"stream-{batch_id}", run_id=run_id, now=now)
            written["partials"] = lake.append(partials, t.partials, partition_by=PARTIALS_PARTITIONS, app_txn=txn,
                                              metadata=meta).version
        outcome.state_writes = result.state_writes
        commit = lake.replace_keys(result.state, t.stream_state, keys=self.state_keys, touched=None, app_txn=txn,
                                   metadata=meta, sort_by=self.state_keys)
        written["stream_state"] = commit.version
        self._held = (commit.version, result.state)

    def _hybrid_inputs(self, key_rows: DataFrame, touched: DataFrame, prune: tuple[str, Any, Any] | None) -> DataFrame:
        """The partial rows that count for the touched keys: stream state of days without a batch
        combine, and the batch partials of days with one (the hybrid rule, as in reduce)."""
        from pyspark.sql import functions as F

        columns = [*self.keys, "n_rows", *self.compiled.acc_columns]
        files = self.lake.files(self.tables.partials)
        batch_days = self._batch_days(files)
        live = key_rows.where(~F.col(DAY).cast("string").isin(batch_days)) if batch_days else key_rows
        out = live.select(*columns)
        if batch_days:
            if prune is not None:
                lo, hi = prune[1].date() - dt.timedelta(days=1), prune[2].date() + dt.timedelta(days=1)
                batch_days = [d for d in batch_days if lo <= dt.date.fromisoformat(d) <= hi]
            paths = [f.path for f in files if f.partition_values.get("source") == "batch"
                     and f.partition_values.get(DAY) in batch_days]
            if paths:
                batch_rows = self.lake.read_files(self.tables.partials, paths).join(touched, self.keys, "left_semi")
                out = out.unionByName(batch_rows.select(*columns))
        return out


class _Stopped(Exception):
    """Raised into Spark when a stop was requested before a mini-batch started."""


def _pending(lake: Lake, path: str, txn: AppTxn) -> bool:
    """Whether ``path`` still lacks this batch's commit (a replay skips the ones it has)."""
    done = lake.txn_version(path, txn.app_id)
    return done is None or done < txn.version


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    """Spark hands timestamps back as naive local time; make them aware UTC."""
    if value is None:
        return None
    return value.astimezone(dt.UTC) if value.tzinfo else value.astimezone().astimezone(dt.UTC)


# Mini-batch plans are many small joins and aggregations: with adaptive execution and broadcast
# joins each stage and each broadcast is a Spark job of its own (about 30 a batch instead of 6),
# and their scheduling, not the data, would set the latency. After the pre-aggregation every
# shuffle holds touched keys only: one partition per core is enough (set in ``run``).
_SMALL_BATCH_CONF = {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1"}


@contextmanager
def _session_conf(spark: SparkSession, conf: dict[str, str]) -> Iterator[None]:
    """Set runtime SQL settings for the block and restore them after (the session may be shared)."""
    before = {k: spark.conf.get(k, None) for k in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM/SIGINT ask for a stop at the next batch boundary (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: Any) -> None:
        log.warning("received %s: stopping at the next mini-batch boundary", signal.Signals(signum).name)
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)


def run(spark: SparkSession, spec: PipelineSpec, *, available_now: bool = False, lake: Lake | None = None,
        run_id: str | None = None, stop: threading.Event | None = None,
        driver_max_keys: int = DRIVER_MAX_KEYS) -> StreamSummary:
    """Run the stream: until the landing files present are done (``available_now``) or until stopped."""
    lake = lake or open_lake(spark)
    tables = PipelineTables(spec.lake, spec.name)
    _check_checkpoint(lake, tables, spec)
    aggregator = MiniBatchAggregator(spark, spec, lake, run_id or new_run_id("stream"), driver_max_keys)
    writer = (source_stream(spark, spec).writeStream.foreachBatch(aggregator)
              .option("checkpointLocation", tables.stream_checkpoint).queryName(f"{spec.name}_stream"))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=spec.stream.trigger.spark)
    stop = stop or threading.Event()
    summary = StreamSummary(aggregator.outcomes)
    conf = {**_SMALL_BATCH_CONF, "spark.sql.shuffle.partitions": str(spark.sparkContext.defaultParallelism)}
    with _stop_on_signals(stop), _session_conf(spark, conf):
        query = writer.start()
        while query.isActive and not stop.is_set():
            query.awaitTermination(1)
        if stop.is_set():
            aggregator.stopping = True
            with aggregator.lock:  # wait for the running mini-batch to finish
                pass
            query.stop()
            summary.stopped_by_signal = True
    if aggregator.error is not None and not isinstance(aggregator.error, _Stopped):
        if isinstance(aggregator.error, PipelineError):
            raise aggregator.error
        raise PipelineError(f"the stream failed: {aggregator.error}") from aggregator.error
    failure = query.exception()
    if failure is not None and not summary.stopped_by_signal:
        raise InputError(f"the stream failed: {spark_read_error(failure)}")
    return summary


def _check_checkpoint(lake: Lake, tables: PipelineTables, spec: PipelineSpec) -> None:
    """State without a checkpoint would make batch ids restart at 0 and skip as 'done': refuse."""
    import os

    done = lake.txn_version(tables.stream_state, app_id(spec))
    if done is not None and "://" not in tables.stream_checkpoint and not os.path.isdir(
            os.path.join(tables.stream_checkpoint, "commits")):
        raise LakeError(
            f"the stream's state in {tables.stream_state} is at mini-batch {done} but its checkpoint "
            f"{tables.stream_checkpoint} is missing; restore the checkpoint, or remove {tables.stream_state} "
            "to start the stream over (its partials then count again only after a batch combine)")
