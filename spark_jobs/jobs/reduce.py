"""reduce-group: merge partial accumulators into the serving ``aggregates`` table, exactly once.

The last ``partials`` version merged is recorded as a Delta app transaction on
``aggregates`` (app id ``<pipeline>.reduce``). A run compares the partial files that count
now with those that counted at that version; only the keys in files added or removed since
are re-merged (from all their current partials) and rewritten, in one commit. A rerun after
a crash either finds its commit (a no-op) or recomputes the same keys.

Which partial files count is the hybrid rule of :mod:`spark_jobs.lake.table_rules`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from spark_jobs.errors import LakeError
from spark_jobs.jobs import rollups
from spark_jobs.jobs.conflicts import retry_conflicts
from spark_jobs.jobs.run_record import RunRecord, recorded_run
from spark_jobs.lake import AppTxn, Lake, PipelineTables, open_lake
from spark_jobs.lake.layout import SPEC_VERSION
from spark_jobs.lake.spec_record import ensure_applied
from spark_jobs.lake.table_rules import counted_files, day_bounds, in_days, reduce_app_id, sort_keys, window_cluster
from spark_jobs.phases.compiled import CompiledAggregates, final_aggregate, merge_sessions
from spark_jobs.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["reduce", "run"]

log = logging.getLogger("spark_jobs")


def reduce(partials: DataFrame, compiled: CompiledAggregates, *, run_id: str) -> DataFrame:
    """Pure transform: partial rows -> ``aggregates`` rows."""
    from pyspark.sql import functions as F

    if compiled.spec.window is not None and compiled.spec.window.session:
        partials = merge_sessions(partials, compiled.spec)
    out = final_aggregate(partials, compiled)
    return out.select(*(c for c in out.columns if c != SPEC_VERSION), F.current_timestamp().alias("updated_at"),
                      F.lit(run_id).alias("run_id"), *([SPEC_VERSION] if SPEC_VERSION in out.columns else []))


def run(spark: SparkSession, spec: PipelineSpec, *, lake: Lake | None = None, run_id: str | None = None,
        full: bool = False) -> RunRecord:
    """Merge what changed in ``partials`` since the last reduce into ``aggregates``.

    A commit that loses a race to another writer of ``aggregates`` (the stream, another reduce)
    re-plans from the new snapshot: it may find its work done, or other keys to merge.
    """
    lake = lake or open_lake(spark)
    tables = PipelineTables(spec.lake, spec.name)
    compiled = CompiledAggregates(spec, ensure_applied(lake, spec, run_id=run_id or ""))
    with recorded_run(lake, tables, job="reduce", batch=None, run_id=run_id) as record:

        def attempt(n: int) -> None:
            record.attempts = n
            _merge(lake, spec, tables, compiled, record, full=full)

        retry_conflicts(attempt, what="reduce", recheck=lambda: ensure_applied(lake, spec))
        if spec.rollups:  # also after a no-op: a crash may have left them behind aggregates
            record.versions_written.update(rollups.refresh(lake, compiled, run_id=record.run_id))
    return record


def _merge(lake: Lake, spec: PipelineSpec, tables: PipelineTables, compiled: CompiledAggregates,
           record: RunRecord, *, full: bool) -> None:
    """One plan and commit, from the tables as they are now."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    sessions = spec.window is not None and spec.window.session
    # the rows a change replaces: a key's windows, or all of a key's sessions (a day's partials may merge or
    # split the sessions the days beside it hold); sessions of one global key are all replaced
    keys = list(spec.group_by if sessions else spec.key_columns)
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
    changed: list[str] | None = None
    if consumed is not None and not full and keys:
        try:
            before = counted_files(lake.files(tables.partials, consumed))
            changed = sorted(set(now) ^ set(before))
        except LakeError as exc:
            log.warning("cannot load partials version %s (%s): merging everything", consumed, exc)
        gone = lake.missing_files(tables.partials, changed or [])
        if gone:  # removed files already vacuumed: their keys are unknown, so merge everything
            log.warning("%d replaced partial files are vacuumed (%s...): merging everything", len(gone), gone[0])
            changed = None
    touched: DataFrame | None
    prune = None
    if changed is None:  # first or full reduce: the whole table is replaced
        paths = list(now)
        touched = None
        inputs = lake.read_files(tables.partials, paths)
    elif sessions and planned is not None:
        touched, extents, prune = _sessions_in_reach(lake, spec, tables, changed, planned)
        keys = list(spec.key_columns)  # the sessions in reach are replaced, with whatever their partials merge into
        paths = list(now)
        if prune is not None:
            days = day_bounds(prune[1], prune[2])
            paths = [p for p, f in now.items() if in_days(f.partition_values.get("event_date"), days)]
        inputs = (lake.read_files(tables.partials, paths).join(extents, list(spec.group_by))
                  .where((F.col("window_start") <= F.col("_hi")) & (F.col("window_end") >= F.col("_lo")))
                  .drop("_lo", "_hi"))
    else:
        touched = lake.read_files(tables.partials, changed).select(*keys).distinct()
        paths = list(now)
        if spec.window is not None and not sessions and changed:
            bounds = touched.agg(F.min("window_start").alias("lo"), F.max("window_end").alias("hi")).first()
            if bounds is not None and bounds["lo"] is not None:
                prune = ("window_start", bounds["lo"], bounds["hi"])
                days = day_bounds(bounds["lo"], bounds["hi"])
                paths = [p for p, f in now.items() if in_days(f.partition_values.get("event_date"), days)]
        inputs = lake.read_files(tables.partials, paths).join(touched, keys, "left_semi")
    if compiled.udafs:
        inputs = inputs.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        rows = reduce(inputs, compiled, run_id=record.run_id)
        commit = lake.replace_keys(rows, tables.aggregates, keys=keys, touched=touched,
                                   app_txn=AppTxn(reduce_app_id(spec), version), sort_by=sort_keys(spec),
                                   cluster=window_cluster(spec, len({now[p].partition_values.get("event_date")
                                                                     for p in paths})), prune=prune,
                                   read_version=planned,
                                   metadata={"run_id": record.run_id, "job": "reduce",
                                             "partials_version": version, "partials_consumed": consumed})
    finally:
        inputs.unpersist()
    # partial rows in the files read (from Delta stats: no extra Spark job)
    record.rows_in = record.rows_aggregated = sum(now[p].num_records or 0 for p in paths)
    record.versions_written = {"aggregates": commit.version}
    record.message = "full merge" if changed is None else f"{len(changed)} partial files changed"


def _sessions_in_reach(lake: Lake, spec: PipelineSpec, tables: PipelineTables, changed: list[str],
                       planned: int) -> tuple[DataFrame, DataFrame, tuple[str, Any, Any] | None]:
    """What a change of some partial files can re-derive, per key: the served sessions that touch the span of
    its changed partial sessions, and that span grown to cover them (``_lo``, ``_hi``). A partial outside it
    cannot join a session inside: it would have been in one of those sessions already. So only the partials
    in the span are merged, and only those sessions replaced (the sessions, the spans, and the window starts
    both lie in)."""
    from pyspark.sql import functions as F

    group = list(spec.group_by)
    changes = (lake.read_files(tables.partials, changed).groupBy(*group)
               .agg(F.min("window_start").alias("_lo"), F.max("window_end").alias("_hi")))
    served = lake.read(tables.aggregates, version=planned).select(*spec.key_columns)
    hit = (served.join(changes, group)
           .where((F.col("window_start") <= F.col("_hi")) & (F.col("window_end") >= F.col("_lo")))
           .select(*spec.key_columns))
    extents = (changes.unionByName(hit.select(*group, F.col("window_start").alias("_lo"), F.col("window_end").alias("_hi")))
               .groupBy(*group).agg(F.min("_lo").alias("_lo"), F.max("_hi").alias("_hi")))
    bounds = extents.agg(F.min("_lo").alias("lo"), F.max("_hi").alias("hi")).first()
    prune = ("window_start", bounds["lo"], bounds["hi"]) if bounds is not None and bounds["lo"] is not None else None
    return hit, extents, prune
