"""Rollups from the stored accumulators: any range of whole windows, any subset of keys, no raw data, no Spark.

``aggregates`` keeps every key's and window's accumulators (counts, sums, HLL and KLL sketches), so "distinct users
per page over a week" is a merge of hourly sketches, not a recomputation. This reads the windows inside [start, end)
with delta-rs (statistics prune the files), groups them by the chosen keys and a time grain, and merges each
aggregate's accumulators with :mod:`spark_jobs.phases.arrow_merge`. When a declared rollup table is as fresh as
``aggregates`` and its buckets tile the request, it reads that instead: a day's rows rather than 24 hours'.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.errors import InspectError
from spark_jobs.inspection.where import parse_where
from spark_jobs.lake.layout import SPEC_VERSION
from spark_jobs.lake.reader import Snapshot, is_table, open_table
from spark_jobs.lake.spec_record import RecordedSpec
from spark_jobs.lake.table_rules import rollup_app_id
from spark_jobs.phases.arrow_merge import bucket_origin, bucket_starts, merge_groups, value_columns
from spark_jobs.phases.compiled import CompiledAggregates
from spark_jobs.spec import PipelineSpec, RollupSpec, parse_duration
from spark_jobs.windows.kind import EPOCH, TS, epoch_micros

__all__ = ["Rollup", "parse_by", "parse_grain", "rollup"]

_US = 1_000_000
SOURCE = b"source"  # the result's schema metadata: the table it merged


@dataclass(frozen=True)
class Rollup:
    """A rollup request: windows in [start, end), grouped by ``by`` and buckets of ``grain_s`` (None: one bucket)."""

    start: dt.datetime
    end: dt.datetime
    by: tuple[str, ...]
    grain_s: int | None = None
    where: str | None = None


def parse_grain(text: str | None) -> int | None:
    """``all`` (or nothing) is one bucket; else a duration such as ``1 day`` or ``1 week``, in seconds."""
    if text is None or text.strip().lower() == "all":
        return None
    try:
        return parse_duration(text.strip().lower()).seconds
    except ValueError:
        raise InspectError(f"bad grain {text!r}; use all, or a duration such as '1 hour', '1 day', '1 week'") from None


def parse_by(text: str | None, spec: PipelineSpec) -> tuple[str, ...]:
    """``page,country`` as keys; None (not given) is every key of the spec, an empty text none (merge them all)."""
    if text is None:
        return spec.group_by
    if not text.strip():
        return ()
    keys = tuple(k.strip() for k in text.split(","))
    if not all(keys):
        raise InspectError(f"bad by {text[:200]!r}; use comma-separated group keys, e.g. "
                           f"{','.join(spec.group_by) or 'page'} (empty: merge across every key)")
    return keys


def _check(spec: PipelineSpec, request: Rollup) -> None:
    """Every reason the request cannot be answered from whole windows, as an InspectError."""
    tile = spec.window.tile
    if tile is None:
        raise InspectError(f"pipeline {spec.name} ({spec.window} windows): {spec.window.rollup_refusal}")
    size = tile.seconds
    if request.end <= request.start:
        raise InspectError(f"--to {request.end:%Y-%m-%d %H:%M:%S} is not after --from "
                           f"{request.start:%Y-%m-%d %H:%M:%S}")
    for flag, t in (("--from", request.start), ("--to", request.end)):
        if offset := _offset(t, size, EPOCH):
            before = t - dt.timedelta(microseconds=offset)
            raise InspectError(f"{flag} {t:%Y-%m-%d %H:%M:%S} cuts a {tile} window; use a window "
                               f"boundary such as {before:%Y-%m-%d %H:%M:%S} or "
                               f"{before + dt.timedelta(seconds=size):%Y-%m-%d %H:%M:%S}")
    if unknown := [k for k in request.by if k not in spec.group_by]:
        raise InspectError(f"unknown key {', '.join(map(repr, unknown))} in --by; {spec.name} is grouped by "
                           f"{', '.join(spec.group_by) or 'nothing'} (drop a key to merge across it)")
    if request.grain_s is not None and request.grain_s % size:
        raise InspectError(f"grain of {request.grain_s} s is not a whole number of {tile} windows; a window "
                           "would fall in two buckets")
    if request.grain_s is not None and _offset(bucket_origin(request.grain_s), size, EPOCH):
        raise InspectError(f"buckets of {request.grain_s} s count from {bucket_origin(request.grain_s):%Y-%m-%d}, "
                           f"which cuts a {tile} window; use a grain of whole days or hours")


def _offset(t: dt.datetime, size_s: int, origin: dt.datetime) -> int:
    """Microseconds of ``t`` past the start of its bucket of ``size_s`` counted from ``origin``."""
    return (epoch_micros(t) - epoch_micros(origin)) % (size_s * _US)


def rollup(table: Snapshot, spec: PipelineSpec, request: Rollup, *, declared: bool = True,
           record: RecordedSpec | None = None) -> pa.Table:
    """Every aggregate's value per ``by`` keys and bucket, merged from the stored accumulators.

    Columns: the ``by`` keys, ``start`` and ``end`` of the bucket (clipped to the range), one column per aggregate,
    and ``n_rows``. An aggregate a spec change added (``record``) is NULL in a bucket holding windows that predate
    it. Raises :class:`InspectError` for a request the windows cannot answer."""
    _check(spec, request)
    compiled = CompiledAggregates(spec, record)
    entries = compiled.entries
    source = _declared_source(table, spec, request) if declared else None
    table = source or table
    schema = table.schema()
    keys = list(request.by)
    columns = [*keys, "window_start", "window_end", "n_rows", *(c for e in entries for c in e.acc_columns),
               *([SPEC_VERSION] if SPEC_VERSION in schema.names else [])]
    if missing := [c for c in columns if c not in schema.names]:
        raise InspectError(f"{table.path} lacks {', '.join(missing)}: it is not the aggregates table of {spec.name}")
    ws_type = schema.field("window_start").type
    expr = ((pc.field("window_start") >= pa.scalar(request.start, ws_type))
            & (pc.field("window_start") < pa.scalar(request.end, ws_type)))
    if request.where:  # keys only: a filter on one window's values would not mean anything once merged
        expr = expr & parse_where(request.where, pa.schema([schema.field(k) for k in spec.group_by]))
    rows = table.read(columns, filter=expr)
    rows = (rows if source is not None else spec.window.rollup_rows(rows)).drop_columns(["window_end"])
    first = epoch_micros(request.start)  # buckets are clipped to the range
    starts = pa.array(np.full(rows.num_rows, first, dtype=np.int64) if request.grain_s is None else np.maximum(
        bucket_starts(rows.column("window_start"), request.grain_s).cast(pa.int64()).to_numpy(), first)).cast(TS)
    rows = rows.drop_columns(["window_start"]).append_column("start", starts)
    merged, accs = merge_groups(rows, [*keys, "start"], entries)
    start = merged.column("start")
    end = (pa.array(np.full(merged.num_rows, epoch_micros(request.end), dtype=np.int64)).cast(TS) if request.grain_s is None
           else pc.min_element_wise(pc.add(start.cast(pa.int64()), request.grain_s * _US),
                                    epoch_micros(request.end)).cast(TS))
    out = pa.table({**{k: merged.column(k) for k in keys}, "start": start, "end": end,
                    **value_columns(merged, accs, entries, compiled.coverage), "n_rows": merged.column("n_rows")})
    out = out.sort_by([(k, "ascending") for k in [*keys, "start"]])
    return out.replace_schema_metadata({SOURCE: Path(table.path).name})


def _declared_source(aggregates: Snapshot, spec: PipelineSpec, request: Rollup) -> Snapshot | None:
    """The coarsest declared rollup table that answers ``request`` exactly: it keeps the request's keys (and those its
    ``where`` names), its buckets tile the range and the grain, and it reflects this very ``aggregates`` version."""
    for declared in sorted(spec.rollups, key=lambda r: -r.grain.seconds):
        if not _tiles(declared, request):
            continue
        if request.where:
            try:
                parse_where(request.where, pa.schema([aggregates.schema().field(k) for k in declared.by]))
            except InspectError:
                continue  # it names a key this rollup merged across
        path = str(Path(aggregates.path).parent / declared.table)
        if is_table(path) and (snapshot := open_table(path)).transaction_version(
                rollup_app_id(spec, declared)) == aggregates.version():
            return snapshot
    return None


def _tiles(declared: RollupSpec, request: Rollup) -> bool:
    grain, origin = declared.grain.seconds, bucket_origin(declared.grain.seconds)
    aligned = not (_offset(request.start, grain, origin) or _offset(request.end, grain, origin))
    return set(request.by) <= set(declared.by) and aligned and (request.grain_s is None or (
        request.grain_s % grain == 0 and not _offset(bucket_origin(request.grain_s), grain, origin)))

