"""Rollups from the stored accumulators: any range of whole windows, any subset of keys, no raw data.

``aggregates`` keeps every key's and window's accumulators (counts, sums, HLL and KLL sketches),
so "distinct users per page over a week" is a merge of hourly sketches, not a recomputation.
This reads the windows inside [start, end) with delta-rs (statistics prune the files), groups
them by the chosen keys and a time grain, and merges each aggregate's accumulators: column-wise
Arrow aggregations where the algebra is a plain fold (``arrow_merge``: counts, sums, min, max),
else the aggregate's own ``merge_all`` per group (sketches through DataSketches' merge, sets, a
user-defined aggregate's ``merge``). No Spark runs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.errors import InspectError
from spark_jobs.inspection.where import parse_where
from spark_jobs.lake.reader import Snapshot
from spark_jobs.plan.phases import CompiledAggregates
from spark_jobs.spec import PipelineSpec, parse_duration

__all__ = ["ORIGIN", "Rollup", "parse_grain", "rollup"]

# Buckets of a grain are counted from a Monday midnight (UTC): days start at midnight, weeks on Monday.
ORIGIN = dt.datetime(1970, 1, 5, tzinfo=dt.UTC)
_US = 1_000_000


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
    raw = text.strip().lower()
    if raw.endswith(("week", "weeks")):
        count = raw.split()[0] if len(raw.split()) == 2 else ""
        if not count.isdigit() or int(count) < 1:
            raise InspectError(f"bad grain {text!r}; use all, or a duration such as '1 hour', '1 day', '1 week'")
        return int(count) * 7 * 86_400
    try:
        return parse_duration(raw).seconds
    except ValueError:
        raise InspectError(f"bad grain {text!r}; use all, or a duration such as '1 hour', '1 day', '1 week'") from None


def _check(spec: PipelineSpec, request: Rollup) -> int:
    """The window size in seconds, after every reason the request cannot be answered from windows."""
    if spec.window is None:
        raise InspectError(f"pipeline {spec.name} has no window: its aggregates hold all time per key, so there is "
                           "no range to roll up")
    if spec.window.hopping:
        raise InspectError(f"pipeline {spec.name} has hopping windows ({spec.window.slide} slides of "
                           f"{spec.window.size}): they overlap, and merging them would count rows several times")
    size = spec.window.size.seconds
    if request.end <= request.start:
        raise InspectError(f"--to {request.end:%Y-%m-%d %H:%M:%S} is not after --from {request.start:%Y-%m-%d %H:%M:%S}")
    for flag, t in (("--from", request.start), ("--to", request.end)):
        offset = int((t - ORIGIN).total_seconds()) % size
        if offset or t.microsecond:
            before = t - dt.timedelta(seconds=offset, microseconds=t.microsecond)
            raise InspectError(f"{flag} {t:%Y-%m-%d %H:%M:%S} cuts a {spec.window.size} window; use a window "
                               f"boundary such as {before:%Y-%m-%d %H:%M:%S} or "
                               f"{before + dt.timedelta(seconds=size):%Y-%m-%d %H:%M:%S}")
    unknown = [k for k in request.by if k not in spec.group_by]
    if unknown:
        raise InspectError(f"unknown key {', '.join(map(repr, unknown))} in --by; {spec.name} is grouped by "
                           f"{', '.join(spec.group_by) or 'nothing'} (drop a key to merge across it)")
    if request.grain_s is not None and request.grain_s % size:
        raise InspectError(f"grain of {request.grain_s} s is not a whole number of {spec.window.size} windows; a window "
                           "would fall in two buckets")
    return size


def rollup(table: Snapshot, spec: PipelineSpec, request: Rollup) -> pa.Table:
    """Every aggregate's value per ``by`` keys and bucket, merged from the stored accumulators.

    Columns: the ``by`` keys, ``start`` and ``end`` of the bucket (clipped to the range), one column
    per aggregate, and ``n_rows``. Raises :class:`InspectError` for a request the windows cannot answer.
    """
    _check(spec, request)
    compiled = CompiledAggregates(spec)
    entries = compiled.entries
    schema = table.schema()
    keys = list(request.by)
    columns = [*keys, "window_start", "n_rows", *(c for e in entries for c in e.acc_columns)]
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise InspectError(f"{table.path} lacks {', '.join(missing)}: it is not the aggregates table of {spec.name}")
    ws_type = schema.field("window_start").type
    expr = ((pc.field("window_start") >= pa.scalar(request.start, ws_type))
            & (pc.field("window_start") < pa.scalar(request.end, ws_type)))
    if request.where:  # keys only: a filter on one window's values would not mean anything once merged
        expr = expr & parse_where(request.where, pa.schema([schema.field(k) for k in spec.group_by]))
    rows = table.read(columns, filter=expr)
    bucket = _buckets(rows.column("window_start"), request)
    rows = rows.drop_columns(["window_start"]).append_column("start", bucket)
    merged = _merge(rows, [*keys, "start"], entries)
    return _values(merged, keys, entries, request)


def _buckets(window_start: pa.ChunkedArray, request: Rollup) -> pa.Array:
    """Each window's bucket start: ``request.start``, or the grain's multiple from :data:`ORIGIN` below it."""
    us = pa.timestamp("us", tz="UTC")
    if request.grain_s is None:
        return pa.array([request.start] * len(window_start), us)
    origin = int(ORIGIN.timestamp()) * _US
    grain = request.grain_s * _US
    ticks = pc.subtract(window_start.cast(us).cast(pa.int64()), origin)
    floored = pc.add(pc.multiply(pc.floor(pc.divide(ticks.cast(pa.float64()), grain)).cast(pa.int64()), grain), origin)
    return pc.max_element_wise(floored, int(request.start.timestamp() * _US)).cast(us)


def _merge(rows: pa.Table, keys: list[str], entries: Sequence[Any]) -> pa.Table:
    """One row per ``keys``: ``n_rows`` summed and each aggregate's accumulator columns merged."""
    fast = [(c, how) for e in entries if e.function.arrow_merge for c, how in zip(e.acc_columns, e.function.arrow_merge,
                                                                                     strict=True)]
    slow = [e for e in entries if not e.function.arrow_merge]
    rows = rows.append_column("__row", pa.array(range(rows.num_rows), pa.int64()))
    aggs: list[tuple[str, str]] = [("n_rows", "sum"), *fast] + ([("__row", "list")] if slow else [])
    grouped = rows.group_by(keys, use_threads=False).aggregate(aggs)
    grouped = grouped.rename_columns([n.removesuffix("_sum").removesuffix("_min").removesuffix("_max")
                                      .removesuffix("_list") for n in grouped.column_names])
    if not slow:
        return grouped
    groups = grouped.column("__row").to_pylist()
    for entry in slow:
        fn, acc_columns = entry.function, entry.acc_columns
        cells = [rows.column(c).to_pylist() for c in acc_columns]
        out: list[list[Any]] = [[] for _ in acc_columns]
        for members in groups:
            merged = fn.merge_all([fn.decode([col[i] for col in cells]) for i in members])
            for j, value in enumerate(fn.encode(merged)):
                out[j].append(value)
        for c, values in zip(acc_columns, out, strict=True):
            grouped = grouped.append_column(c, pa.array(values, rows.schema.field(c).type))
    return grouped.drop_columns(["__row"])


def _values(merged: pa.Table, keys: list[str], entries: Sequence[Any], request: Rollup) -> pa.Table:
    us = pa.timestamp("us", tz="UTC")
    start = merged.column("start")
    end = (pa.array([request.end] * merged.num_rows, us) if request.grain_s is None else pc.min_element_wise(
        pc.add(start.cast(pa.int64()), request.grain_s * _US), int(request.end.timestamp() * _US)).cast(us))
    arrays: dict[str, Any] = {k: merged.column(k) for k in keys}
    arrays.update(start=start, end=end)
    for entry in entries:
        fn, acc_columns = entry.function, entry.acc_columns
        cells = [merged.column(c).to_pylist() for c in acc_columns]
        arrays[entry.name] = pa.array([fn.get_value(fn.decode([col[i] for col in cells]))
                                       for i in range(merged.num_rows)])
    arrays["n_rows"] = merged.column("n_rows")
    out = pa.table(arrays)
    return out.sort_by([(k, "ascending") for k in [*keys, "start"]])
