"""Declared rollups: ``aggregates`` merged into coarser buckets, kept up to date by reduce and the stream.

A rollup table (``rollup_<name>``) holds, per ``by`` keys and bucket of ``grain``, the merge of the stored
accumulators of the served rows that tile the bucket, derived from ``aggregates`` alone (so the hybrid rule holds
in it as there). Exactly once: the app transaction ``<pipeline>.rollup_<name>:<grain>s:<keys>`` records the
``aggregates`` version it reflects; a refresh recomputes, in one commit, the buckets that the window statistics of
the files added or removed since then name. Recomputing is idempotent: a crash between the ``aggregates`` commit
and the rollup's leaves the rollup behind only until the next refresh.
"""

from __future__ import annotations

import datetime as dt
import logging
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.jobs.conflicts import retry_conflicts
from spark_jobs.jobs.forked import forked_map
from spark_jobs.lake import AppTxn, Cluster, Lake, PipelineTables
from spark_jobs.lake.layout import SPEC_VERSION, table_schema
from spark_jobs.lake.reader import READ_ERRORS, Snapshot, open_table, read_plain
from spark_jobs.lake.table_rules import rollup_app_id
from spark_jobs.lake.time_chunks import in_ranges, merged_spans, time_chunks
from spark_jobs.phases.arrow_merge import bucket_floor, bucket_starts, encoded_columns, merge_groups, value_columns
from spark_jobs.phases.compiled import CompiledAggregates
from spark_jobs.spec import RollupSpec
from spark_jobs.windows.kind import EPOCH, TS, epoch_micros

__all__ = ["refresh"]

log = logging.getLogger("spark_jobs")
_US = 1_000_000
MAX_FILES = 64  # files a refresh lays its rows out in: about one per bucket, so the next refresh rewrites few


def refresh(lake: Lake, compiled: CompiledAggregates, *, run_id: str) -> dict[str, int | None]:
    """Bring every declared rollup up to the latest ``aggregates`` version; their versions written
    (None for a rollup that was already up to date)."""
    return {r.table: retry_conflicts(partial(_attempt, lake, compiled, r, run_id), what=f"rollup {r.name}")
            for r in compiled.spec.rollups}


def _attempt(lake: Lake, compiled: CompiledAggregates, rollup: RollupSpec, run_id: str, attempt: int) -> int | None:
    """One plan and commit, from the tables as they are now."""
    spec = compiled.spec
    tables = PipelineTables(spec.lake, spec.name)
    if (source := lake.version(tables.aggregates)) is None:
        return None
    path = tables.rollup(rollup.name)
    app = rollup_app_id(spec, rollup)
    planned = lake.version(path)
    done = None if planned is None else lake.txn_version(path, app, planned)
    if done is not None and done >= source:
        return None
    aggregates = open_table(tables.aggregates, source)
    ranges = None if done is None else changed_buckets(aggregates, done, rollup.grain.seconds)
    rows = rollup_rows(aggregates, compiled, rollup, ranges, run_id=run_id)
    keys = [*rollup.by, "window_start", "window_end"]
    touched = None
    if ranges is not None:  # buckets changed since ``done``: the rollup table exists
        old = open_table(path, planned).read(keys, filter=in_ranges("window_start", ranges))
        touched = pa.concat_tables([old, rows.select(keys)]).group_by(keys).aggregate([])
    buckets = len(pc.unique(rows.column("window_start"))) if rows.num_rows else 1
    commit = lake.replace_keys(rows, path, keys=keys, touched=touched, app_txn=AppTxn(app, source),
                               sort_by=["window_start", *rollup.by], read_version=planned,
                               cluster=Cluster("window_start", min(buckets, MAX_FILES), by="hash"),
                               metadata={"run_id": run_id, "job": "rollup", "aggregates_version": source,
                                         "aggregates_consumed": done})
    log.info("rollup %s: aggregates version %s merged (%s buckets), version %s", rollup.name, source,
             "all" if ranges is None else len(ranges), commit.version)
    return commit.version


def changed_buckets(aggregates: Snapshot, since: int, grain_s: int) -> list[tuple[dt.datetime, dt.datetime]] | None:
    """The [start, end) bucket ranges holding a window of a file added or removed after ``since``
    (merged where they touch); None when that cannot be told (the old version's log is gone, a file
    lacks statistics): then every bucket is recomputed."""
    try:
        before = aggregates.at(since).add_actions()
    except READ_ERRORS as exc:  # a cleaned-up log
        log.warning("cannot load aggregates version %s (%s): recomputing every bucket", since, exc)
        return None
    now = aggregates.add_actions()
    spans: list[tuple[int, int]] = []
    for table, other in ((now, before), (before, now)):
        kept = set(other.column("path").to_pylist())
        for row in table.select(["path", "min.window_start", "max.window_start"]).to_pylist():
            if row["path"] in kept:
                continue
            if row["min.window_start"] is None or row["max.window_start"] is None:
                return None
            lo, hi = (epoch_micros(bucket_floor(row[c], grain_s)) for c in ("min.window_start", "max.window_start"))
            spans.append((lo, hi + grain_s * _US))
    return [(EPOCH + dt.timedelta(microseconds=lo), EPOCH + dt.timedelta(microseconds=hi)) for lo, hi in merged_spans(spans)]


def rollup_rows(aggregates: Snapshot, compiled: CompiledAggregates, rollup: RollupSpec,
                ranges: list[tuple[dt.datetime, dt.datetime]] | None, *, run_id: str) -> pa.Table:
    """The rollup table's rows for the buckets in ``ranges`` (all when None), from ``aggregates``. Read a run of buckets
    at a time on every core (:mod:`spark_jobs.lake.time_chunks`): a refresh of every bucket holds the rows of a few."""
    grain = rollup.grain.seconds
    schema = aggregates.schema()
    acc = [c for e in compiled.entries for c in e.acc_columns]
    versions = [SPEC_VERSION] if SPEC_VERSION in schema.names else []
    columns = [*rollup.by, "window_start", "window_end", "n_rows", *acc, *versions]

    rolled = partial(_rolled, compiled=compiled, rollup=rollup, schema=schema, versions=versions, run_id=run_id)
    chunks = time_chunks(aggregates.spans("window_start"), lambda t: bucket_floor(t, grain), dt.timedelta(seconds=grain),
                         ranges)
    if chunks is None:  # files a worker cannot read, or without statistics: all at once, here
        return rolled(aggregates.read(columns, filter=None if ranges is None else in_ranges("window_start", ranges)))
    out = forked_map(lambda c: rolled(read_plain(c.uris, schema, columns, in_ranges("window_start", c.ranges))),
                     chunks) or [rolled(schema.empty_table().select(columns))]
    return pa.concat_tables(out) if len(out) > 1 else out[0]


def _rolled(rows: pa.Table, compiled: CompiledAggregates, rollup: RollupSpec, schema: pa.Schema, versions: list[str],
            *, run_id: str) -> pa.Table:
    """The rollup rows of the buckets of ``aggregates`` rows that hold each of them whole."""
    spec, entries, grain = compiled.spec, compiled.entries, rollup.grain.seconds
    rows = spec.window.rollup_rows(rows).drop_columns(["window_end"])
    rows = rows.drop_columns(["window_start"]).append_column("window_start", bucket_starts(rows["window_start"], grain))
    merged, accs = merge_groups(rows, [*rollup.by, "window_start"], entries)
    end = pc.add(merged.column("window_start").cast(pa.int64()), grain * _US).cast(TS)
    now = pa.scalar(dt.datetime.now(dt.UTC), TS)
    out = {**{k: merged.column(k) for k in [*rollup.by, "window_start", "n_rows", *versions]}, "window_end": end,
           **value_columns(merged, accs, entries, compiled.coverage),
           **encoded_columns(merged, accs, entries, schema, compiled.coverage),
           "updated_at": pa.repeat(now, merged.num_rows), "run_id": pa.repeat(pa.scalar(run_id), merged.num_rows)}
    columns = [f for f in table_schema(spec, rollup.table, rollup) if f.name in out]
    return pa.table([out[f.name].cast(f.type) for f in columns], pa.schema(columns))
