"""stream: windowed mini-batch aggregation with keyed state and a retraction changelog, exactly once.

Spark Structured Streaming tracks new landing files; each micro-batch is a mini-batch in Flink's sense
(:mod:`spark_jobs.stream.minibatch`). Spark's checkpoint (``_stream/checkpoint``) fixes which files each batch id
holds, so a replayed batch sees the same rows. docs/streaming.md tells the whole story."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_jobs.errors import InputError, LakeError, PipelineError
from spark_jobs.jobs import changelog_feed, rollups
from spark_jobs.jobs.landing_files import spark_read_error
from spark_jobs.jobs.run_record import new_run_id
from spark_jobs.lake import Lake, PipelineTables, open_lake, storage
from spark_jobs.lake.table_rules import stream_app_id
from spark_jobs.spark_failures import spark_errors
from spark_jobs.spec import PipelineSpec
from spark_jobs.stream.arrow_engine import DRIVER_MAX_KEYS
from spark_jobs.stream.minibatch import BatchOutcome, MiniBatchAggregator, Stopped

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BatchOutcome", "StreamSummary", "run", "source_stream"]

log = logging.getLogger("spark_jobs")

_FILE_SCHEMA = "path string, modificationTime timestamp, length bigint, content binary"


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
        if quarantined := sum(b.files_quarantined for b in done):
            text += f"; {quarantined} landing file(s) quarantined (see dead_letter)"
        if empty := sum(b.files_skipped for b in done):
            text += f"; {empty} empty file(s) skipped"
        if skipped := len(self.batches) - len(done):
            text += f"; {skipped} replayed batches were already committed"
        return text + ("; stopped by signal at a batch boundary" if self.stopped_by_signal else "")


def source_stream(spark: SparkSession, spec: PipelineSpec) -> DataFrame:
    """New landing files as a stream of their paths, ``stream.max_files_per_batch`` a batch: names only, since
    ``foreachBatch`` hands over an already-planned RDD that Spark can neither prune nor scan with its vectorised
    readers; each mini-batch reads its files as an ordinary batch DataFrame instead."""
    if not storage.is_dir(spec.source.path):
        raise InputError(f"landing directory {spec.source.path} does not exist; create it or fix source.path "
                         "(python -m spark_jobs generate writes sample data)")
    return (spark.readStream.format("binaryFile").schema(_FILE_SCHEMA)  # "content" is pruned: never read
            .option("maxFilesPerTrigger", spec.stream.max_files_per_batch).load(spec.source.path).select("path"))


# Mini-batch plans are many small joins and aggregations: with adaptive execution and broadcast joins each stage and
# broadcast is a Spark job (about 30 a batch instead of 6) whose scheduling would set the latency. After the
# pre-aggregation every shuffle holds touched keys only: one partition per core is enough (set in ``run``). A batch's
# groups hold small sketches: 64k may stay in a task's hash map (sorting at 16k took a fifth of a 20-file batch).
# Its cached groups and served values live until its commits: compressing their columns took longer than computing them.
_SMALL_BATCH_CONF = {"spark.sql.adaptive.enabled": "false", "spark.sql.autoBroadcastJoinThreshold": "-1",
                     "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "65536",
                     "spark.sql.inMemoryColumnarStorage.compressed": "false"}


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
    # after a stop between commits: another writer's change of aggregates untold, rollups behind
    changelog_feed.tell_commits(lake, spec, run_id=run_id or "stream-start")
    rollups.refresh(lake, aggregator.compiled, run_id=run_id or "stream-start")
    trigger = {"availableNow": True} if available_now else {"processingTime": spec.stream.trigger.spark}
    writer = (source_stream(spark, spec).writeStream.foreachBatch(aggregator).trigger(**trigger)
              .option("checkpointLocation", tables.stream_checkpoint).queryName(f"{spec.name}_stream"))
    stop = stop or threading.Event()
    summary = StreamSummary(aggregator.outcomes)
    conf = {**_SMALL_BATCH_CONF, "spark.sql.shuffle.partitions": str(spark.sparkContext.defaultParallelism)}
    with _stop_on_signals(stop), _session_conf(spark, conf):
        try:
            aggregator.replay_handed_off()
            query = writer.start()
            with contextlib.suppress(*spark_errors()):  # a failed query raises here: its error is reported below
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
    if aggregator.error is not None and not isinstance(aggregator.error, Stopped):
        if isinstance(aggregator.error, PipelineError):
            raise aggregator.error
        raise PipelineError(f"the stream failed: {aggregator.error}") from aggregator.error
    if rollup_error is not None:
        raise PipelineError(f"the stream's last rollup refresh failed: {rollup_error}; the next stream run or "
                            "reduce refreshes the rollups again") from rollup_error
    if (failure := query.exception()) is not None and not summary.stopped_by_signal:
        raise InputError(f"the stream failed: {spark_read_error(failure)}")
    return summary


def _check_checkpoint(lake: Lake, tables: PipelineTables, spec: PipelineSpec) -> None:
    """State without a checkpoint would make batch ids restart at 0 and skip as 'done': refuse."""
    done = lake.txn_version(tables.stream_state, stream_app_id(spec))
    if done is not None and not storage.is_dir(f"{tables.stream_checkpoint}/commits"):
        raise LakeError(
            f"the stream's state in {tables.stream_state} is at mini-batch {done} but its checkpoint "
            f"{tables.stream_checkpoint} is missing; restore the checkpoint, or remove {tables.stream_state} "
            "to start the stream over (its partials then count again only after a batch combine)")
