"""reduce-group: merge partial accumulators into the serving ``aggregates`` table, exactly once, and tell the
change in ``changelog`` (:mod:`spark_jobs.jobs.changelog_feed`).

The last ``partials`` version merged is recorded as a Delta app transaction on ``aggregates`` (app id
``<pipeline>.reduce``). A run compares the partial files that count now with those that counted at that version;
only the keys in files added or removed since are re-merged (from all their current partials) and rewritten, in one
commit. A rerun after a crash either finds its commit (a no-op) or recomputes the same keys.

Which partial files count is the hybrid rule of :mod:`spark_jobs.lake.table_rules`.
"""

from __future__ import annotations

import datetime as dt
import logging
from functools import partial
from typing import TYPE_CHECKING

from spark_jobs.errors import LakeError
from spark_jobs.jobs import changelog_feed, rollups
from spark_jobs.jobs.conflicts import retry_conflicts
from spark_jobs.jobs.run_record import RunRecord, recorded_run
from spark_jobs.key_match import join_on_keys
from spark_jobs.lake import AppTxn, DataFile, Lake, PipelineTables, open_lake
from spark_jobs.lake.layout import SPEC_VERSION
from spark_jobs.lake.spec_record import ensure_applied
from spark_jobs.lake.table_rules import DAY, counted_files, in_days, reduce_app_id, sort_keys, window_cluster
from spark_jobs.persisted import persisted
from spark_jobs.phases.compiled import CompiledAggregates, final_aggregate
from spark_jobs.spark_functions import F
from spark_jobs.spec import PipelineSpec
from spark_jobs.windows import Stored

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["reduce", "run", "served_rows"]

log = logging.getLogger("spark_jobs")


def reduce(partials: DataFrame, compiled: CompiledAggregates, *, run_id: str) -> DataFrame:
    """Pure transform: stored partial rows -> ``aggregates`` rows (the window kind serves them first)."""
    spec = compiled.spec
    return served_rows(final_aggregate(spec.window.serve(partials, spec.group_by), compiled), run_id=run_id)


def served_rows(merged: DataFrame, *, run_id: str) -> DataFrame:
    """Merged rows laid out as ``aggregates`` rows: stamped with the time and run, ``spec_version`` last."""
    return merged.select(*(c for c in merged.columns if c != SPEC_VERSION), F.current_timestamp().alias("updated_at"),
                         F.lit(run_id).alias("run_id"), *([SPEC_VERSION] if SPEC_VERSION in merged.columns else []))


def run(spark: SparkSession, spec: PipelineSpec, *, lake: Lake | None = None, run_id: str | None = None,
        full: bool = False) -> RunRecord:
    """Merge what changed in ``partials`` since the last reduce into ``aggregates``. A commit that loses a race
    to another writer of ``aggregates`` (the stream, another reduce) re-plans from the new snapshot: it may find
    its work done, or other keys to merge."""
    lake = lake or open_lake(spark)
    tables = PipelineTables(spec.lake, spec.name)
    compiled = CompiledAggregates(spec, ensure_applied(lake, spec, run_id=run_id or ""))
    with recorded_run(lake, tables, job="reduce", batch=None, run_id=run_id) as record:
        retry_conflicts(partial(_merge, lake, spec, tables, compiled, record, full=full), what="reduce",
                        recheck=lambda: ensure_applied(lake, spec))
        # also after a no-op: a stop may have left the changelog or the rollups behind aggregates
        if (told := changelog_feed.tell_commits(lake, spec, run_id=record.run_id)) is not None:
            record.versions_written["changelog"] = told
        record.versions_written.update(rollups.refresh(lake, compiled, run_id=record.run_id))  # {}: no rollups
    return record


def _merge(lake: Lake, spec: PipelineSpec, tables: PipelineTables, compiled: CompiledAggregates,
           record: RunRecord, attempt: int, *, full: bool) -> None:
    """One plan and commit, from the tables as they are now: the served rows the changed partial files reach
    (the window kind's reach), re-merged from every partial that counts for them."""
    record.attempts = attempt
    version = lake.version(tables.partials)
    if version is None:
        raise LakeError(f"no partials table at {tables.partials}; run combine for at least one day first")
    # the aggregates snapshot planned from: what was consumed, and what the commit is checked against
    planned = lake.version(tables.aggregates)
    consumed = None if planned is None else lake.txn_version(tables.aggregates, reduce_app_id(spec), planned)
    record.inputs = [tables.partials]
    record.versions_read = {"partials": version, "aggregates": planned, "partials_consumed": consumed}
    if consumed is not None and consumed >= version and not full:
        record.status = "noop"
        record.message = f"partials version {version} is already merged"
        return
    now = counted_files(lake.files(tables.partials, version))
    changed = None if full or not spec.key_columns else _changed(lake, tables, now, consumed)
    reach = None
    if changed is None:  # first or full reduce: the whole table is replaced
        inputs, paths = lake.read_files(tables.partials, list(now)), list(now)
    else:
        reach = spec.window.reach_of(lake.read_files(tables.partials, changed),
                                     _stored(lake, spec, tables, now, planned), spec.group_by)
        inputs = reach.stored
        paths = [p for p, f in now.items() if reach.days is None or in_days(f.partition_values.get(DAY), reach.days)]
    if compiled.udafs:
        inputs = persisted(inputs)
    try:
        rows = reduce(inputs, compiled, run_id=record.run_id)
        commit = lake.replace_keys(rows, tables.aggregates, keys=list(spec.key_columns), sort_by=sort_keys(spec),
                                   touched=reach.touched if reach else None, prune=reach.prune if reach else None,
                                   app_txn=AppTxn(reduce_app_id(spec), version), read_version=planned,
                                   cluster=window_cluster(spec, len({now[p].partition_values.get(DAY) for p in paths})),
                                   metadata={"run_id": record.run_id, "job": "reduce",
                                             "partials_version": version, "partials_consumed": consumed})
    finally:
        inputs.unpersist()
        for frame in reach.cached if reach else ():
            frame.unpersist()
    # partial rows in the files read (from Delta stats: no extra Spark job)
    record.rows_in = record.rows_aggregated = sum(now[p].num_records or 0 for p in paths)
    record.versions_written = {"aggregates": commit.version}
    record.message = "full merge" if changed is None else f"{len(changed)} partial files changed"


def _changed(lake: Lake, tables: PipelineTables, now: dict[str, DataFile], consumed: int | None) -> list[str] | None:
    """The partial files added or removed since the version merged last (None: merge everything)."""
    if consumed is None:
        return None
    try:
        changed = sorted(set(now) ^ set(counted_files(lake.files(tables.partials, consumed))))
    except LakeError as exc:
        log.warning("cannot load partials version %s (%s): merging everything", consumed, exc)
        return None
    gone = lake.missing_files(tables.partials, changed)
    if gone:  # removed files already vacuumed: their keys are unknown, so merge everything
        log.warning("%d replaced partial files are vacuumed (%s...): merging everything", len(gone), gone[0])
        return None
    return changed


def _stored(lake: Lake, spec: PipelineSpec, tables: PipelineTables, now: dict[str, DataFile],
            planned: int | None) -> Stored:
    """The counted partial files, read by event day, and the served keys of ``aggregates`` as planned."""
    day_of = {p: dt.date.fromisoformat(d) for p, f in now.items() if (d := f.partition_values.get(DAY))}

    def read(lo: dt.date | None, hi: dt.date | None, keys: DataFrame | None) -> DataFrame:
        paths = [p for p in now
                 if p not in day_of or ((lo is None or lo <= day_of[p]) and (hi is None or day_of[p] <= hi))]
        rows = lake.read_files(tables.partials, paths)
        return rows if keys is None else join_on_keys(rows, keys, spec.group_by, "left_semi")

    def served() -> tuple[DataFrame | None, int | None]:
        return (None, None) if planned is None else (
            lake.read(tables.aggregates, version=planned).select(*spec.key_columns), planned)

    days = (min(day_of.values()), max(day_of.values())) if day_of else None
    return Stored(read, days, served)
