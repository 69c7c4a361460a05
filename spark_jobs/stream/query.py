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
uninterrupted run. Declared rollups are then refreshed from ``aggregates`` in the background,
while the next batch reads its files (the stream's start and end wait for them).

A batch that came to the driver in its read is handed off: its file list recorded, its merge and commits run on
a commit thread while Spark reads the next batch, whose merge waits for them
(:mod:`spark_jobs.stream.handoff`: Spark marks the batch done before they land, so a restart replays the
record).

One pass over a batch's files: rejected and late rows ride through the pre-aggregation as
groups of their own, and a batch that fits the driver (by its files' row counts, or by the groups
per row of the batches before it) comes to it, groups and rejects, in that same Spark job.

Where the state merge runs: one mini-batch step (:mod:`spark_jobs.stream.outputs`) with two
interchangeable engines. A batch that touches few keys (``DRIVER_MAX_KEYS`` after its
pre-aggregation) merges on the driver with the aggregates' Python algebra
(:mod:`spark_jobs.stream.arrow_engine`); larger batches, a state too large to hold, and the
first batch of session windows merge in Spark (:mod:`spark_jobs.stream.spark_engine`). Both give the same outputs,
committed by one routine, with the hybrid rule applied the same way.

Watermark: the largest event time in state minus ``stream.watermark``, as of the batch's
start. Rows older than it go to ``dead_letter`` as ``late``. Windows ending at or before
it are closed and leave state. Without a window, state is unbounded group aggregation.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_jobs.errors import InputError, LakeError, PipelineError
from spark_jobs.jobs import rollups
from spark_jobs.jobs.conflicts import retry_conflicts
from spark_jobs.jobs.landing import CORRUPT, classify, spark_read_error, with_raw
from spark_jobs.jobs.landing_files import Screen, isolate_unreadable, screen
from spark_jobs.jobs.run_record import RunRecord, new_run_id, recorded_run
from spark_jobs.jobs.timing import PhaseTimer
from spark_jobs.lake import AppTxn, Lake, PipelineTables, open_lake
from spark_jobs.lake.layout import SPEC_VERSION
from spark_jobs.lake.spec_record import ensure_applied
from spark_jobs.lake.table_rules import DAY, batch_days, batch_files_in, day_bounds, stream_app_id
from spark_jobs.phases import CompiledAggregates, assign_windows, partial_aggregate
from spark_jobs.spec import PipelineSpec
from spark_jobs.stream.arrow_engine import DRIVER_MAX_KEYS, DriverEngine
from spark_jobs.stream.arrow_sessions import DriverSessionEngine
from spark_jobs.stream.handoff import Handoffs
from spark_jobs.stream.outputs import Committed, MergeEngine, MiniBatch, Rows, commit_outputs
from spark_jobs.stream.spark_engine import SessionEngine, SparkEngine

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["BatchOutcome", "StreamSummary", "landed_rows", "run", "source_stream"]

log = logging.getLogger("spark_jobs")

_FILE_SCHEMA = "path string, modificationTime timestamp, length bigint, content binary"


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
    files_quarantined: int = 0  # landing files that could not be read: in dead_letter, never read again
    files_skipped: int = 0  # zero-byte landing files
    visible_at: float | None = None  # wall-clock time the aggregates commit landed (latency figures)
    phases: PhaseTimer = field(default_factory=PhaseTimer)  # where its time went


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
        quarantined, empty = sum(b.files_quarantined for b in done), sum(b.files_skipped for b in done)
        if quarantined:
            text += f"; {quarantined} landing file(s) quarantined (see dead_letter)"
        if empty:
            text += f"; {empty} empty file(s) skipped"
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


class MiniBatchAggregator:
    """The ``foreachBatch`` function: one mini-batch in, five atomic commits out (see module doc)."""

    def __init__(self, spark: SparkSession, spec: PipelineSpec, lake: Lake, run_id: str,
                 driver_max_keys: int = DRIVER_MAX_KEYS) -> None:
        self.spark, self.spec, self.lake, self.run_id = spark, spec, lake, run_id
        self.driver_max_keys = driver_max_keys
        self.tables = PipelineTables(spec.lake, spec.name)
        # the spec the lake records; each mini-batch checks it again (an ``apply`` stops the stream)
        self.record = ensure_applied(lake, spec, run_id=run_id)
        self.compiled = CompiledAggregates(spec, self.record)
        # the first engine that accepts a batch merges it
        self.engines: list[MergeEngine] = [DriverEngine(self.compiled, lake, driver_max_keys),
                                           SparkEngine(spark, self.compiled, lake)]
        if spec.window is not None and spec.window.session:  # sessions merge across a key's days
            self.engines = [DriverSessionEngine(self.compiled, lake, driver_max_keys),
                            SessionEngine(spark, self.compiled, lake)]
        self.app = stream_app_id(spec)
        self.lock = threading.Lock()
        self.stopping = False
        self.error: BaseException | None = None
        self.outcomes: list[BatchOutcome] = []
        self._high: dt.datetime | None = None  # largest event time in state, loaded lazily
        self._rollup_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{spec.name}-rollups")
        self._rollups: Future[dict[str, int | None]] | None = None
        self._high_loaded = False
        self._groups_per_row: float | None = None  # a batch's groups over its footers' bound: the largest seen
        self.handoffs = Handoffs(self.tables.stream_checkpoint)
        self.hand_off = lake.name == "embedded"  # delta-spark commits are Spark jobs: they stay in the batch
        self._commit_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{spec.name}-commits")
        self._commits: Future[None] | None = None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """One mini-batch. One that came to the driver in its read is handed off: its file list is recorded, its
        merge and commits run on the commit thread while Spark reads the next batch, whose own merge waits for
        them (see :mod:`spark_jobs.stream.handoff`)."""
        with self.lock:
            if self.stopping:  # the query stops before this batch; a restart replays it
                raise _Stopped()
            try:
                begun = self.begin(df, batch_id)
                if isinstance(begun, BatchOutcome):
                    self.committed()
                    self.outcomes.append(begun)
                    return
                hand_off = self.hand_off and begun.read.collected is not None
                try:
                    self.committed()
                    if hand_off:
                        self.handoffs.record(batch_id, begun.files)
                except BaseException:
                    begun.read.combined.unpersist()
                    with begun.recorded:  # its run record fails with it
                        raise
                if hand_off:
                    begun.phase.untrack_jobs()  # its phases now run beside the next batch's Spark jobs
                    self._commits = self._commit_thread.submit(self._finish_handed_off, begun)
                else:
                    self.outcomes.append(self.finish(begun))
            except BaseException as exc:
                self.error = exc
                raise

    def _finish_handed_off(self, begun: _Begun) -> None:
        self.outcomes.append(self.finish(begun))
        self.handoffs.forget(begun.outcome.batch_id)

    def committed(self) -> None:
        """Wait for the handed-off batch's commits; raise their error."""
        running, self._commits = self._commits, None
        if running is not None:
            running.result()

    def replay_handed_off(self) -> None:
        """At the stream's start: commit the batches handed off but not committed when it last stopped."""
        state = self.tables.stream_state
        for batch_id, files in self.handoffs.pending(self.lake.txn_version(state, self.app)):
            log.warning("mini-batch %d was handed off to its commits when the stream stopped: committing it now "
                        "from its %d recorded files", batch_id, len(files))
            self.outcomes.append(self.process(files, batch_id))
        self.handoffs.forget(self.lake.txn_version(state, self.app))

    # ------------------------------------------------------------------ rollups
    def refresh_rollups(self, *, run_id: str) -> None:
        """Start the rollups' refresh to the latest ``aggregates`` in the background, after the one before
        it is done (whose failure fails this batch). It is Arrow and delta-rs work on the driver that runs
        while the next batch reads and pre-aggregates in Spark; a refresh is idempotent (a crash leaves the
        rollups behind until the next one), and the rollup commit records its run and ``aggregates`` version."""
        self.rollups_done()
        self._rollups = self._rollup_thread.submit(rollups.refresh, self.lake, self.compiled, run_id=run_id)

    def rollups_done(self) -> None:
        """Wait for the running rollup refresh; raise its error."""
        running, self._rollups = self._rollups, None
        if running is not None:
            running.result()

    def close(self) -> BaseException | None:
        """At the stream's end: wait for the last handed-off batch's commits (their error is the stream's) and
        the last rollup refresh; the refresh's error, if it failed."""
        try:
            self.committed()
        except BaseException as exc:
            if self.error is None or isinstance(self.error, _Stopped):
                self.error = exc
        try:
            self.rollups_done()
            return None
        except Exception as exc:
            return exc
        finally:
            self._commit_thread.shutdown()
            self._rollup_thread.shutdown()

    # ------------------------------------------------------------------ state
    def _watermark(self, high: dt.datetime | None) -> dt.datetime | None:
        if self.spec.window is None or high is None:
            return None
        return high - dt.timedelta(seconds=self.spec.stream.watermark.seconds)

    def _load_high(self) -> dt.datetime | None:
        from pyspark.sql import functions as F

        if not self._high_loaded:
            t = self.tables
            row = (self.lake.read(t.stream_state).agg(F.max("max_event_time").alias("m")).first()
                   if self.lake.version(t.stream_state) is not None else None)
            self._high = _utc(row["m"]) if row is not None and row["m"] is not None else None
            self._high_loaded = True
        return self._high

    # ------------------------------------------------------------------ batch
    def process(self, landed: DataFrame | list[str], batch_id: int) -> BatchOutcome:
        """One mini-batch, read, merged and committed before it returns."""
        begun = self.begin(landed, batch_id)
        return begun if isinstance(begun, BatchOutcome) else self.finish(begun)

    def begin(self, landed: DataFrame | list[str], batch_id: int) -> BatchOutcome | _Begun:
        """The batch's Spark work: its files (the stream's paths, or a hand-off record's) screened and read in one
        pass. A batch with nothing to do (already committed, no files) is done here."""
        from pyspark.sql import functions as F

        spec, lake, t = self.spec, self.lake, self.tables
        phase = PhaseTimer(self.spark)
        with phase("files"):
            done = lake.txn_version(t.stream_state, self.app)
            if done is not None and done >= batch_id:
                log.info("mini-batch %d is already committed (state at %d): skipped", batch_id, done)
                return BatchOutcome(batch_id, replayed=True)
            ensure_applied(lake, spec, run_id=self.run_id)  # a spec applied since the stream started stops it here
            files = sorted(landed if isinstance(landed, list) else (r["path"] for r in landed.collect()))
            if not files:
                return BatchOutcome(batch_id)
            found = screen(files, spec)  # a file that cannot be read is never half-counted, nor read again
            found.check(spec, f"mini-batch {batch_id}")
        outcome = BatchOutcome(batch_id, files_quarantined=len(found.bad), files_skipped=len(found.empty), phases=phase)
        with contextlib.ExitStack() as recorded:
            record = recorded.enter_context(recorded_run(lake, t, job="stream", batch=f"stream-{batch_id}",
                                                         run_id=f"{self.run_id}-{batch_id}"))
            record.inputs = files
            outcome.watermark = watermark = self._watermark(self._load_high())
            try:
                with phase("read and pre-aggregate"):
                    read = self._read(found, watermark, batch_id)
            except InputError:
                culprits = isolate_unreadable(found.readable, lambda f: landed_rows(
                    self.spark.read, spec, [f]).agg(F.count("_raw")).first())
                if not culprits:
                    raise
                found.drop(culprits)
                found.check(spec, f"mini-batch {batch_id}")
                outcome.files_quarantined = len(found.bad)
                read = self._read(found, watermark, batch_id)
            if read.collected is None and read.keys + read.rejected <= self.driver_max_keys:
                with phase("collect"):  # small enough for the driver: one transfer of its groups and rejects
                    read.collect()
            record.files_quarantined, record.files_skipped = outcome.files_quarantined, outcome.files_skipped
            outcome.rows_rejected, outcome.rows_late = read.rejected, read.late
            outcome.rows_aggregated = read.rows
            outcome.rows_in = outcome.rows_aggregated + outcome.rows_rejected
            record.rows_in, record.rows_rejected = outcome.rows_in, outcome.rows_rejected
            record.rows_aggregated = outcome.rows_aggregated
            if outcome.rows_aggregated:  # the next batch's watermark: its read need not wait for this commit
                self._high = max(h for h in (self._high, read.high) if h is not None)
            return _Begun(files, found, read, outcome, record, phase, self._high, recorded.pop_all())

    def finish(self, begun: _Begun) -> BatchOutcome:
        """The batch's merge and commits (the run record closes with them)."""
        spec, lake, t = self.spec, self.lake, self.tables
        read, outcome, record, phase, high = begun.read, begun.outcome, begun.record, begun.phase, begun.high
        batch_id = outcome.batch_id
        txn = AppTxn(self.app, batch_id)
        with begun.recorded:
            record.versions_read = {"stream_state": lake.version(t.stream_state)}

            def step(attempt: int) -> Committed:
                """Merge and commit; after a lost race, again from the tables as they are now (the
                hybrid rule may have changed) while the tables that have the batch's commit skip it."""
                record.attempts = attempt
                batch, out, engine = None, None, None
                if outcome.rows_aggregated:
                    assert read.low is not None and read.high is not None
                    with phase("merge"):
                        batch = MiniBatch(batch_id, record.run_id, read.delta(), (read.low, read.high),
                                          self._watermark(high), *self._counted_batch_partials((read.low, read.high)),
                                          rows=read.collected)
                        engine = next(e for e in self.engines if e.accepts(read.keys))
                        outcome.on_driver = engine.name == "driver"
                        out = engine.merge(batch)
                committed = commit_outputs(lake, spec, txn, run_id=record.run_id, rejects=read.rejects(),
                                           rejected=outcome.rows_rejected, batch=batch, out=out, files=begun.found.bad,
                                           phase=phase)
                if engine is not None and out is not None:
                    engine.committed(committed.written["stream_state"], out)
                return committed

            committed = retry_conflicts(step, what=f"mini-batch {batch_id}", recheck=lambda: ensure_applied(lake, spec))
            if spec.rollups:
                with phase("rollups"):  # the wait for the previous batch's refresh, if it is still running
                    self.refresh_rollups(run_id=record.run_id)
            read.combined.unpersist()
            outcome.state_writes, outcome.changes = committed.state_writes, committed.changes
            outcome.visible_at = committed.visible_at
            record.versions_written = committed.written
            watermark = outcome.watermark
            record.message = (f"mini-batch {batch_id}: {outcome.state_writes} state writes, {outcome.changes} "
                              f"changelog rows, {outcome.rows_late} late"
                              + (f", watermark {watermark:%Y-%m-%d %H:%M:%S}" if watermark else "")
                              + f"; {phase.text()}")
        return outcome

    def _read(self, found: Screen, watermark: dt.datetime | None, batch_id: int) -> _Read:
        """The batch's one pass over its files: rows classified (late ones too) and pre-aggregated per (day,
        key, window), each reject a group of its own (:func:`_rejects_apart`). A batch that fits the driver engine,
        by its files' row counts or by the groups per row of the batches before it, comes to the driver in that
        same Spark job; another is cached and counted first. A file unreadable past its footer fails here
        (InputError)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        spec = self.spec
        et = F.col(spec.source.event_time)
        files = found.readable
        landed = landed_rows(self.spark.read, spec, files) if files else _no_rows(self.spark, spec)
        rows = classify(landed, spec, F.col(DAY), DAY)
        late = F.col("_reason").isNull() & (et < F.lit(watermark)) if watermark is not None else F.lit(False)
        rows = rows.withColumn("_late", late).withColumn("_reason", F.coalesce("_reason", F.when(
            F.col("_late"), F.concat(F.lit("late: "), et.cast("string"), F.lit(
                f" is older than the watermark {watermark or dt.datetime.min:%Y-%m-%d %H:%M:%S} UTC; the batch "
                "combine of its day counts it")))))
        windowed = assign_windows(_rejects_apart(rows.withColumn(DAY, F.col(DAY).cast("date")), spec), spec)
        if spec.window is not None:  # a reject's windows are one group
            windowed = windowed.withColumns({c: F.when(F.col(_BAD).isNull(), F.col(c))
                                             for c in ("window_start", "window_end")})
        combined = partial_aggregate(windowed, self.compiled, extra_keys=[DAY, _BAD], extra_aggs=[
            F.max(et).alias("max_event_time"), F.min(et).alias("_first_seen"), _row_count(spec).alias("_rows"),
            F.first("_reject").alias("_reject")])
        if self.record.uncovered_through is not None:  # days whose earlier rows a spec change dropped
            combined = combined.withColumn(SPEC_VERSION, F.when(F.col(DAY) <= F.lit(self.record.uncovered_through),
                                                                F.lit(0).cast("bigint")).otherwise(F.col(SPEC_VERSION)))
        bound = found.readable_rows()
        groups = None if bound is None else bound * _windows_per_row(spec)  # at most one group per row and window
        # to the driver in the pass itself when the footers bound the batch under the driver's limit, or when twice
        # the groups per row of the densest batch yet would fit; else cached and counted first
        fits = groups is not None and groups <= self.driver_max_keys
        expected = fits or (groups is not None and self._groups_per_row is not None
                            and 2 * self._groups_per_row * groups <= self.driver_max_keys)
        read = _Read(combined)
        try:
            if not (expected and read.collect(bounded=fits)):
                combined.persist(StorageLevel.MEMORY_AND_DISK)
                valid = F.col(_BAD).isNull()
                read.counted(combined.agg(
                    F.sum(F.when(valid, F.col("_rows"))).alias("rows"), F.min(F.when(valid, F.col("_first_seen"))).alias("low"),
                    F.max(F.when(valid, F.col("max_event_time"))).alias("high"), F.count(F.when(valid, 1)).alias("keys"),
                    F.count(F.when(~valid, 1)).alias("rejected"), F.count(F.when(F.col("_reject._late"), 1)).alias("late"),
                ).first())
        except Exception as exc:
            read.combined.unpersist()
            raise InputError(f"mini-batch {batch_id} failed reading {spec.source.path}: "
                             f"{spark_read_error(exc)}") from exc
        if groups:
            self._groups_per_row = max(self._groups_per_row or 0.0, (read.keys + read.rejected) / groups)
        return read

    def _counted_batch_partials(self, span: tuple[dt.datetime, dt.datetime]
                                ) -> tuple[frozenset[dt.date], tuple[str, ...]]:
        """The hybrid rule for the batch's keys: the days they can hold rows of that have a batch
        combine, and those days' batch partial files (whose rows count instead of the stream's)."""
        window = self.spec.window
        reach = dt.timedelta(seconds=window.length.seconds) if window else None
        bounds = day_bounds(span[0] - reach, span[1] + reach) if reach is not None else None
        files = batch_files_in(self.lake.files(self.tables.partials), bounds)
        days = frozenset(dt.date.fromisoformat(d) for d in batch_days(files))
        return days, tuple(f.path for f in files)


_BAD = "_bad"
_REJECT = "struct<_reason string, _raw string, _file string, _late boolean>"  # Arrow needs nullable fields


def _rejects_apart(rows: DataFrame, spec: PipelineSpec) -> DataFrame:
    """Rejects ride through the pre-aggregation as groups of their own, so that one pass over a batch's files
    yields both. ``_bad``, a grouping key, is a row id for a reject (NULL for a valid row), ``_reject`` its
    reason, record, file and lateness; a reject's group keys are NULL (never those of a valid row) and its
    event time a constant, so that it falls in windows no valid row shares."""
    from pyspark.sql import functions as F

    bad = F.col("_reason").isNotNull()
    # Parquet is read with the spec's types, so its record is its typed columns: written out here, for the
    # rejects alone (a ``_raw`` column would be computed for every row before the branch)
    raw = F.to_json(F.struct(*(c for c, _ in spec.source.schema))) if spec.source.format == "parquet" else F.col("_raw")
    reject = F.when(bad, F.struct("_reason", raw.alias("_raw"), "_file", "_late").cast(_REJECT))
    columns = []
    for c in rows.columns:
        if c in spec.group_by:
            columns.append(F.when(~bad, F.col(c)).alias(c))
        elif c == spec.source.event_time:
            columns.append(F.when(bad, F.timestamp_seconds(F.lit(0))).otherwise(F.col(c)).alias(c))
        elif c not in ("_reason", "_raw", "_file", "_late"):
            columns.append(F.col(c))
    return rows.select(*columns, F.when(bad, F.monotonically_increasing_id()).alias(_BAD), reject.alias("_reject"))


def _row_count(spec: PipelineSpec) -> Column:
    """The rows of a group, each row counted once: a hopping window's copies of a row count in its last window
    only (the one it entered less than a slide after the start)."""
    from pyspark.sql import functions as F

    w = spec.window
    if w is None or not w.hopping or w.slide is None:
        return F.count(F.lit(1))
    since_start = F.unix_micros(F.col(spec.source.event_time)) - F.unix_micros(F.col("window_start"))
    return F.count(F.when(since_start < F.lit(w.slide.seconds * 1_000_000), 1))


def _windows_per_row(spec: PipelineSpec) -> int:
    """How many (key, window) groups one row can make: a hopping window's size over its slide."""
    w = spec.window
    if w is None or not w.hopping or w.slide is None or w.size is None:
        return 1
    return -(-w.size.seconds // w.slide.seconds)


@dataclass
class _Begun:
    """A mini-batch read, its merge and commits to come; ``recorded`` holds its open run record."""

    files: list[str]
    found: Screen
    read: _Read
    outcome: BatchOutcome
    record: RunRecord
    phase: PhaseTimer
    high: dt.datetime | None  # the largest event time in state once it commits
    recorded: contextlib.ExitStack


class _Read:
    """A mini-batch's files read once: its pre-aggregated groups and its rejects in one DataFrame (cached when
    it is not collected in the pass), their counts, and (batches that fit the driver) both on the driver as Arrow."""

    def __init__(self, combined: DataFrame) -> None:
        self.combined = combined
        self.rows = self.keys = self.rejected = self.late = 0
        self.low: dt.datetime | None = None  # event times of the valid rows
        self.high: dt.datetime | None = None
        self.collected: pa.Table | None = None  # the valid groups on the driver
        self._rejects: pa.Table | None = None

    def counted(self, counts: Any) -> None:
        self.rows, self.keys = int(counts["rows"] or 0), int(counts["keys"])
        self.rejected, self.late = int(counts["rejected"]), int(counts["late"])
        self.low, self.high = _utc(counts["low"]), _utc(counts["high"])

    def collect(self, *, bounded: bool = True) -> bool:
        """Bring the groups and rejects to the driver. An estimated batch (not ``bounded``) whose result outgrows
        ``spark.driver.maxResultSize`` is not collected (False): it is counted and merged in Spark instead."""
        import pyarrow.compute as pc

        try:
            table = self.combined.toArrow()
        except Exception as exc:
            if bounded or "maxResultSize" not in str(exc):
                raise
            log.warning("a mini-batch held more groups than expected; merging it in Spark (%s)", exc)
            return False
        bad = pc.is_valid(table.column(_BAD))
        valid = table.filter(pc.invert(bad)).drop_columns([_BAD, "_reject"])
        rejects = pa.Table.from_struct_array(table.filter(bad).column("_reject").combine_chunks())
        self.collected, self._rejects = valid, rejects
        self.rows, self.keys = int(pc.sum(valid.column("_rows")).as_py() or 0), valid.num_rows
        self.rejected, self.late = rejects.num_rows, int(pc.sum(rejects.column("_late")).as_py() or 0)
        self.low = _utc(pc.min(valid.column("_first_seen")).as_py())
        self.high = _utc(pc.max(valid.column("max_event_time")).as_py())
        return True

    def delta(self) -> DataFrame:
        from pyspark.sql import functions as F

        return self.combined.where(F.col(_BAD).isNull()).drop(_BAD, "_reject", "_rows")

    def rejects(self) -> Rows:
        from pyspark.sql import functions as F

        if self._rejects is not None:
            return self._rejects
        return self.combined.where(F.col(_BAD).isNotNull()).select("_reject.*")


def _no_rows(spark: SparkSession, spec: PipelineSpec) -> DataFrame:
    """What :func:`landed_rows` gives for a batch without a readable file: no rows, the same columns."""
    if spec.source.format == "parquet":
        columns = [f"`{c}` {t}" for c, t in spec.source.schema]
    else:
        columns = [f"`{c}` string" for c, _ in spec.source.schema] + [f"`{CORRUPT}` string"]
    return spark.createDataFrame([], ", ".join([*columns, "_raw string", "_file string", f"{DAY} string"]))


class _Stopped(Exception):
    """Raised into Spark when a stop was requested before a mini-batch started."""


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    """Spark hands timestamps back as naive local time; make them aware UTC."""
    if value is None:
        return None
    return value.astimezone(dt.UTC) if value.tzinfo else value.astimezone().astimezone(dt.UTC)


# Mini-batch plans are many small joins and aggregations: with adaptive execution and broadcast
# joins each stage and each broadcast is a Spark job of its own (about 30 a batch instead of 6),
# and their scheduling, not the data, would set the latency. After the pre-aggregation every
# shuffle holds touched keys only: one partition per core is enough (set in ``run``).
# The pre-aggregation's groups (a key's window within a batch) hold few rows each at a live spread, so their
# sketches stay small (a few KB a group): a task may hold 64k of them in its object hash map before it falls
# back to sorting (a fifth of a 20-file batch's time, a quarter of a 50-file one's, at the session's 16k).
_SMALL_BATCH_CONF = {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1",
                     "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "65536"}


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
    rollups.refresh(lake, aggregator.compiled, run_id=run_id or "stream-start")  # after a crash between commits
    writer = (source_stream(spark, spec).writeStream.foreachBatch(aggregator)
              .option("checkpointLocation", tables.stream_checkpoint).queryName(f"{spec.name}_stream"))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=spec.stream.trigger.spark)
    stop = stop or threading.Event()
    summary = StreamSummary(aggregator.outcomes)
    conf = {**_SMALL_BATCH_CONF, "spark.sql.shuffle.partitions": str(spark.sparkContext.defaultParallelism)}
    with _stop_on_signals(stop), _session_conf(spark, conf):
        try:
            aggregator.replay_handed_off()
            query = writer.start()
            with contextlib.suppress(Exception):  # a failed query raises here: its error is reported below
                while query.isActive and not stop.is_set():
                    query.awaitTermination(1)
            if stop.is_set():
                aggregator.stopping = True
                with aggregator.lock:  # wait for the running mini-batch to finish
                    pass
                query.stop()
                summary.stopped_by_signal = True
        finally:
            rollup_error = aggregator.close()  # the last batch's commits, too
    if aggregator.error is not None and not isinstance(aggregator.error, _Stopped):
        if isinstance(aggregator.error, PipelineError):
            raise aggregator.error
        raise PipelineError(f"the stream failed: {aggregator.error}") from aggregator.error
    if rollup_error is not None:
        raise PipelineError(f"the stream's last rollup refresh failed: {rollup_error}; the next stream run or "
                            "reduce refreshes the rollups again") from rollup_error
    failure = query.exception()
    if failure is not None and not summary.stopped_by_signal:
        raise InputError(f"the stream failed: {spark_read_error(failure)}")
    return summary


def _check_checkpoint(lake: Lake, tables: PipelineTables, spec: PipelineSpec) -> None:
    """State without a checkpoint would make batch ids restart at 0 and skip as 'done': refuse."""
    import os

    done = lake.txn_version(tables.stream_state, stream_app_id(spec))
    if done is not None and "://" not in tables.stream_checkpoint and not os.path.isdir(
            os.path.join(tables.stream_checkpoint, "commits")):
        raise LakeError(
            f"the stream's state in {tables.stream_state} is at mini-batch {done} but its checkpoint "
            f"{tables.stream_checkpoint} is missing; restore the checkpoint, or remove {tables.stream_state} "
            "to start the stream over (its partials then count again only after a batch combine)")
