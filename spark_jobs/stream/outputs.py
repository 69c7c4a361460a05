"""What a merge engine starts from (:class:`MiniBatch`), what it gives (:class:`BatchOutputs`), and the one routine
that commits it, each table once per batch id. Both engines apply the same hybrid rule; a test holds them to
byte-identical tables."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Union

import pyarrow as pa

from spark_jobs.jobs.combine import write_dead_letters
from spark_jobs.jobs.landing_files import BadFile
from spark_jobs.jobs.timing import PhaseTimer
from spark_jobs.lake import AppTxn, Lake, PipelineTables
from spark_jobs.lake.reader import commit_with_txn
from spark_jobs.lake.table_rules import DAY, PARTIALS_PARTITIONS, sort_keys, stream_layout
from spark_jobs.spark_functions import F
from spark_jobs.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["BatchCommits", "BatchOutputs", "MergeEngine", "MiniBatch", "Rows", "commit_outputs", "pending", "stream_stamp"]

Rows = Union["DataFrame", "pa.Table"]


@dataclass(frozen=True)
class MiniBatch:
    """A mini-batch after its pre-aggregation: what either merge engine starts from."""

    batch_id: int
    run_id: str
    groups: DataFrame  # one row per (event day, key, stored window): state columns and ``_first_seen``
    span: tuple[dt.datetime, dt.datetime]  # event times of its valid rows
    closes: dt.datetime | None  # windows ending at or before it leave state
    batch_days: frozenset[dt.date] = frozenset()  # touched days with a batch combine (the hybrid rule) ...
    batch_files: tuple[str, ...] = ()  # ... and their batch partial files, whose rows count instead
    collected: pa.Table | None = None  # ``groups`` when the pre-aggregation already brought them to the driver
    watermark: dt.datetime | None = None  # as of its start: the state's sessions ending before it have left

    @property
    def name(self) -> str:
        return f"stream-{self.batch_id}"


@dataclass(frozen=True)
class BatchOutputs:
    """What one mini-batch writes, as Spark DataFrames or Arrow tables, laid out as their tables."""

    aggregates: Rows  # the touched keys that still exist, as ``aggregates`` rows
    touched: Rows | None  # the touched keys: their other rows in ``aggregates`` are replaced (None: every row)
    changelog: Rows
    partials: Rows  # the batch's pre-aggregated rows as ``partials`` rows (source ``stream``)
    state: Rows  # the whole new state
    read_version: int | None = None  # ``touched`` names served rows of this version of ``aggregates``
    prune: tuple[str, Any, Any] | None = None  # (column, lo, hi) holding every touched row (else the layout's)


def stream_stamp(batch_id: int, run_id: str) -> dict[str, Any]:
    """What each changelog row of a mini-batch carries; its ``aggregates_version`` is known at the commit."""
    return {"batch_id": batch_id, "writer": "stream", "run_id": run_id}


class MergeEngine(Protocol):
    """Merges a mini-batch into the stream's state and derives every output table."""

    def merge(self, batch: MiniBatch) -> BatchOutputs: ...

    def after_commit(self, state_version: int | None, outputs: BatchOutputs) -> None:
        """Told the state version its outputs made (an engine may keep state between batches)."""


@dataclass
class BatchCommits:
    written: dict[str, int | None] = field(default_factory=dict)
    state_writes: int = 0  # (day, key, window) accumulators written: the batch's partial rows
    changes: int = 0
    visible_at: float | None = None  # wall-clock time the aggregates commit landed


def _with_version(rows: Rows, version: int | None) -> Rows:
    """The changelog rows stamped with the ``aggregates`` version they tell."""
    if isinstance(rows, pa.Table):
        return rows.append_column("aggregates_version", pa.repeat(pa.scalar(version, pa.int64()), rows.num_rows))
    return rows.withColumn("aggregates_version", F.lit(version).cast("bigint"))


def pending(lake: Lake, path: str, txn: AppTxn) -> bool:
    """Whether ``path`` still lacks this batch's commit (a replay skips the ones it has)."""
    done = lake.txn_version(path, txn.app_id)
    return done is None or done < txn.version


def commit_outputs(lake: Lake, spec: PipelineSpec, txn: AppTxn, *, run_id: str, rejects: Rows, rejected: int,
                   batch: MiniBatch | None, out: BatchOutputs | None, files: Sequence[BadFile] = (),
                   phase: PhaseTimer | None = None) -> BatchCommits:
    """Commit a batch: its rejected rows, then (when it aggregated any) its outputs, each as one Delta commit
    carrying ``txn``, state last (see :mod:`spark_jobs.stream.minibatch`); dead letters, with the quarantined
    ``files``, are replaced by (job, batch): idempotent."""
    t, done = PipelineTables(spec.lake, spec.name), BatchCommits()
    phase = phase or PhaseTimer()
    with phase("commit dead_letter"):
        dead = write_dead_letters(lake, t, rejects, job="stream", batch=f"stream-{txn.version}", run_id=run_id,
                                  rejected=rejected, files=files)
    if dead is not None:
        done.written["dead_letter"] = dead.version
    if batch is None or out is None:
        return done
    keys = list(spec.key_columns)
    meta: dict[str, Any] = {"run_id": batch.run_id, "job": "stream", "batch_id": batch.batch_id}
    driver_rows = out.aggregates.num_rows if isinstance(out.aggregates, pa.Table) else None
    prune, cluster = stream_layout(spec, batch.span, driver_rows)
    prune = out.prune or prune
    if pending(lake, t.aggregates, txn):  # first: it is what readers wait for
        with phase("commit aggregates"):
            done.written["aggregates"] = lake.replace_keys(
                out.aggregates, t.aggregates, keys=keys, touched=out.touched, app_txn=txn, metadata=meta,
                sort_by=sort_keys(spec), cluster=cluster, prune=prune, read_version=out.read_version).version
        done.visible_at = time.time()
    if pending(lake, t.changelog, txn):
        version = done.written.get("aggregates")
        if version is None:  # a replay: the batch's aggregates commit landed before the stop
            version = commit_with_txn(t.aggregates, txn, newest=lake.version(t.aggregates) or 0)
        with phase("commit changelog"):  # a log: a dropped aggregate's or key's columns stay, NULL from then on
            commit = lake.append(_with_version(out.changelog, version), t.changelog, app_txn=txn, metadata=meta,
                                 conform=True)
        done.written["changelog"] = commit.version
        done.changes = commit.rows_added
    if pending(lake, t.partials, txn):
        with phase("commit partials"):
            commit = lake.append(out.partials, t.partials, partition_by=PARTIALS_PARTITIONS, app_txn=txn, metadata=meta)
        done.written["partials"] = commit.version
        done.state_writes = commit.rows_added
    else:
        done.state_writes = out.partials.num_rows if isinstance(out.partials, pa.Table) else int(out.partials.count())
    state_keys = [DAY, *keys]
    with phase("commit state"):
        done.written["stream_state"] = lake.replace_keys(out.state, t.stream_state, keys=state_keys, touched=None,
                                                         app_txn=txn, metadata=meta, sort_by=state_keys).version
    return done
