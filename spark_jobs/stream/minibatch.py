"""One mini-batch, from its files to its commits: the ``foreachBatch`` function of the stream.

Its commits, in this order, each one Delta commit carrying the app transaction (``<pipeline>.stream``, batch id):
rejected and late rows to ``dead_letter``; the served rows it reaches to ``aggregates`` (what readers wait for); the
changes to ``changelog``; its partial accumulators to ``partials``; the new state, last, so a batch with a state commit
is complete and a replay skips every table that has its commit: after a kill -9 anywhere, a restart gives the tables of
an uninterrupted run. A batch that came to the driver is handed off where the lake commits on the driver
(:mod:`spark_jobs.stream.handoff`). The watermark is the largest event time in state minus ``stream.watermark``, as of
the batch's start; lateness is per window (:meth:`~spark_jobs.windows.WindowKind.with_late`)."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_jobs.durations import utc
from spark_jobs.errors import InputError
from spark_jobs.jobs import rollups
from spark_jobs.jobs.conflicts import retry_conflicts
from spark_jobs.jobs.landing import read_one
from spark_jobs.jobs.landing_files import Screen, isolate_unreadable, screen
from spark_jobs.jobs.run_record import RunRecord, recorded_run
from spark_jobs.jobs.timing import PhaseTimer
from spark_jobs.lake import AppTxn, Lake, PipelineTables
from spark_jobs.lake.spec_record import ensure_applied
from spark_jobs.lake.table_rules import batch_days, batch_files_in, day_bounds, stream_app_id
from spark_jobs.phases import CompiledAggregates
from spark_jobs.spark_functions import F
from spark_jobs.spec import PipelineSpec
from spark_jobs.stream.arrow_engine import DRIVER_MAX_KEYS, ArrowEngine
from spark_jobs.stream.batch_read import BatchRead, BatchReader
from spark_jobs.stream.handoff import Handoffs
from spark_jobs.stream.outputs import BatchCommits, MergeEngine, MiniBatch, commit_outputs
from spark_jobs.stream.spark_engine import SparkEngine

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BatchOutcome", "MiniBatchAggregator", "Stopped"]

log = logging.getLogger("spark_jobs")


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


class MiniBatchAggregator:
    """The ``foreachBatch`` function: one mini-batch in, five atomic commits out (see module doc)."""

    def __init__(self, spark: SparkSession, spec: PipelineSpec, lake: Lake, run_id: str,
                 driver_max_keys: int = DRIVER_MAX_KEYS) -> None:
        self.spark, self.spec, self.lake, self.run_id, self.driver_max_keys = spark, spec, lake, run_id, driver_max_keys
        self.tables = PipelineTables(spec.lake, spec.name)
        self.record = ensure_applied(lake, spec, run_id=run_id)  # each batch checks again: an ``apply`` stops it
        self.compiled = CompiledAggregates(spec, self.record)
        self.reader = BatchReader(spark, self.compiled, self.record, driver_max_keys)
        self.arrow = ArrowEngine(spark, self.compiled, lake, driver_max_keys)
        self.spark_engine = SparkEngine(spark, self.compiled, lake)
        self.app = stream_app_id(spec)
        self.lock = threading.Lock()
        self.stopping = False
        self.error: BaseException | None = None
        self.outcomes: list[BatchOutcome] = []
        self._high: dt.datetime | None = None  # largest event time in state, loaded lazily
        self._rollup_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{spec.name}-rollups")
        self._rollups: Future[dict[str, int | None]] | None = None
        self._high_loaded = False
        self.handoffs = Handoffs(self.tables.stream_checkpoint)
        self.hand_off = lake.commits_on_driver  # commits that are Spark jobs stay in the batch
        self._commit_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{spec.name}-commits")
        self._commits: Future[None] | None = None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """A batch that came to the driver in its read is handed off (:mod:`spark_jobs.stream.handoff`): its merge
        and commits run on the commit thread while Spark reads the next batch."""
        with self.lock:
            if self.stopping:  # the query stops before this batch; a restart replays it
                raise Stopped()
            try:
                begun = self.begin(df, batch_id)
                if isinstance(begun, BatchOutcome):
                    self.wait_for_handoff()
                    self.outcomes.append(begun)
                    return
                hand_off = self.hand_off and begun.read.collected is not None
                try:
                    self.wait_for_handoff()
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

    def wait_for_handoff(self) -> None:
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
            begun = self.begin(files, batch_id)
            self.outcomes.append(begun if isinstance(begun, BatchOutcome) else self.finish(begun))
        self.handoffs.forget(self.lake.txn_version(state, self.app))

    def rollups_done(self) -> None:
        """Wait for the running rollup refresh; raise its error."""
        running, self._rollups = self._rollups, None
        if running is not None:
            running.result()

    def close(self) -> BaseException | None:
        """At the stream's end: wait for the last handed-off commits (their error is the stream's) and rollup refresh
        (whose error it returns)."""
        try:
            self.wait_for_handoff()
        except BaseException as exc:
            if self.error is None or isinstance(self.error, Stopped):
                self.error = exc
        try:
            self.rollups_done()
            return None
        except Exception as exc:  # the refresh's own error, whatever it is, is the stream's to report
            return exc
        finally:
            self._commit_thread.shutdown()
            self._rollup_thread.shutdown()

    def _watermark(self, high: dt.datetime | None) -> dt.datetime | None:
        if not self.spec.window.closes or high is None:
            return None
        return high - dt.timedelta(seconds=self.spec.stream.watermark.seconds)

    def _load_high(self) -> dt.datetime | None:
        state = self.tables.stream_state
        if not self._high_loaded and self.lake.version(state) is not None:
            row = self.lake.read(state).agg(F.max("max_event_time").alias("m")).first()
            self._high = utc(row["m"]) if row is not None else None
        self._high_loaded = True
        return self._high

    def begin(self, landed: DataFrame | list[str], batch_id: int) -> BatchOutcome | _Begun:
        """The batch's Spark work: its files (the stream's paths, or a hand-off record's) screened and read in one
        pass. A batch with nothing to do (already committed, no files) is done here."""
        spec, lake, t = self.spec, self.lake, self.tables
        phase = PhaseTimer(self.spark)
        with phase("files"):
            if (done := lake.txn_version(t.stream_state, self.app)) is not None and done >= batch_id:
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
                    read = self.reader.read(found, watermark, batch_id)
            except InputError:
                if not (culprits := isolate_unreadable(found.readable, lambda f: read_one(self.spark, spec, found, f))):
                    raise
                found.drop(culprits)
                found.check(spec, f"mini-batch {batch_id}")
                outcome.files_quarantined = len(found.bad)
                read = self.reader.read(found, watermark, batch_id)
            if read.collected is None and read.keys + read.rejected <= self.driver_max_keys:
                with phase("collect"):  # small enough for the driver: one transfer of its groups and rejects
                    read.collect()
            record.files_quarantined, record.files_skipped = outcome.files_quarantined, outcome.files_skipped
            outcome.rows_rejected, outcome.rows_late, outcome.rows_aggregated = read.rejected, read.late, read.rows
            outcome.rows_in = record.rows_in = read.rows + read.rejected
            record.rows_rejected, record.rows_aggregated = read.rejected, read.rows
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

            def step(attempt: int) -> BatchCommits:
                """Merge and commit; after a lost race, again from the tables as they are now (the
                hybrid rule may have changed) while the tables that have the batch's commit skip it."""
                record.attempts = attempt
                batch, out = None, None
                engine: MergeEngine | None = None
                if outcome.rows_aggregated:
                    assert read.low is not None and read.high is not None
                    with phase("merge"):
                        batch = MiniBatch(batch_id, record.run_id, read.groups(), (read.low, read.high),
                                          self._watermark(high), *self._counted_batch_partials((read.low, read.high)),
                                          collected=read.collected, watermark=outcome.watermark)
                        engine = self.arrow if self.arrow.fits(batch, read.keys) else self.spark_engine
                        outcome.on_driver = engine is self.arrow
                        out = engine.merge(batch)
                commits = commit_outputs(lake, spec, txn, run_id=record.run_id, rejects=read.rejects(),
                                           rejected=outcome.rows_rejected, batch=batch, out=out, files=begun.found.bad,
                                           phase=phase)
                if engine is not None and out is not None:
                    engine.after_commit(commits.written["stream_state"], out)
                return commits

            commits = retry_conflicts(step, what=f"mini-batch {batch_id}", recheck=lambda: ensure_applied(lake, spec))
            if spec.rollups:  # refreshed beside the next batch's read; idempotent, so a crash only leaves them behind
                with phase("rollups"):  # the wait for the previous batch's refresh (its error fails this batch)
                    self.rollups_done()
                    self._rollups = self._rollup_thread.submit(rollups.refresh, lake, self.compiled,
                                                               run_id=record.run_id)
            read.combined.unpersist()
            outcome.state_writes, outcome.changes = commits.state_writes, commits.changes
            outcome.visible_at, record.versions_written = commits.visible_at, commits.written
            watermark = outcome.watermark
            record.message = (f"mini-batch {batch_id}: {outcome.state_writes} state writes, {outcome.changes} "
                              f"changelog rows, {outcome.rows_late} late"
                              + (f", watermark {watermark:%Y-%m-%d %H:%M:%S}" if watermark else "")
                              + f"; {phase.text()}")
        return outcome

    def _counted_batch_partials(self, span: tuple[dt.datetime, dt.datetime]
                                ) -> tuple[frozenset[dt.date], tuple[str, ...]]:
        """The hybrid rule for the batch's keys: the days they can hold rows of that have a batch
        combine, and those days' batch partial files (whose rows count instead of the stream's)."""
        reach = self.spec.window.reach
        bounds = None if reach is None else day_bounds(span[0] - dt.timedelta(seconds=reach.seconds),
                                                       span[1] + dt.timedelta(seconds=reach.seconds))
        files = batch_files_in(self.lake.files(self.tables.partials), bounds)
        days = frozenset(dt.date.fromisoformat(d) for d in batch_days(files))
        return days, tuple(f.path for f in files)


@dataclass
class _Begun:
    """A mini-batch read, its merge and commits to come; ``recorded`` holds its open run record."""

    files: list[str]
    found: Screen
    read: BatchRead
    outcome: BatchOutcome
    record: RunRecord
    phase: PhaseTimer
    high: dt.datetime | None  # the largest event time in state once it commits
    recorded: contextlib.ExitStack


class Stopped(Exception):
    """Raised into Spark when a stop was requested before a mini-batch started."""
