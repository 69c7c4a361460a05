"""Merge stored accumulators into coarser buckets, in Arrow on the driver: the rollups' algebra.

``aggregates`` keeps every key's and window's accumulators, so a week of distinct users is a
merge of hourly HLL sketches, not a recomputation. Where an aggregate's merge is a plain fold
(``arrow_merge``: counts, sums, min, max) it runs as an Arrow hash aggregation; anything else
through the aggregate's own ``merge_all`` per group (DataSketches' union and merge, sets,
first/last, a user-defined aggregate's ``merge``). Both the ad-hoc ``inspect rollup`` and the
declared rollup tables merge here, so they agree by construction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.aggregates.base import BoundAggregate

__all__ = ["WEEK", "bucket_floor", "bucket_origin", "bucket_starts", "merge_buckets", "merge_groups", "value_columns"]

WEEK = 7 * 86_400
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MONDAY = dt.datetime(1970, 1, 5, tzinfo=dt.UTC)
_US = 1_000_000
TS = pa.timestamp("us", tz="UTC")


def bucket_origin(grain_s: int) -> dt.datetime:
    """Where buckets of ``grain_s`` are counted from: the epoch, as Spark counts windows, except that
    weeks start on a Monday (the epoch was a Thursday)."""
    return MONDAY if grain_s % WEEK == 0 else EPOCH


def bucket_floor(t: dt.datetime, grain_s: int) -> dt.datetime:
    """The start of the bucket of ``grain_s`` holding ``t`` (aware)."""
    origin = bucket_origin(grain_s)
    offset = (t - origin) // dt.timedelta(seconds=grain_s)
    return origin + offset * dt.timedelta(seconds=grain_s)


def bucket_starts(window_start: pa.ChunkedArray | pa.Array, grain_s: int) -> pa.Array:
    """Each window's bucket start, vectorised."""
    origin = int(bucket_origin(grain_s).timestamp()) * _US
    grain = grain_s * _US
    ticks = pc.subtract(window_start.cast(TS).cast(pa.int64()), origin)
    quotient = pc.divide(ticks, grain)  # truncates toward zero: step back where that rounded up
    quotient = pc.if_else(pc.greater(pc.multiply(quotient, grain), ticks), pc.subtract(quotient, 1), quotient)
    return pc.add(pc.multiply(quotient, grain), origin).cast(TS)


def merge_buckets(rows: pa.Table, by: Sequence[str], entries: Sequence[BoundAggregate], *, grain_s: int) -> pa.Table:
    """Rows of ``aggregates`` (``by`` keys, ``window_start``, ``n_rows``, accumulators) merged per
    ``by`` keys and bucket: ``window_start``/``window_end`` of the bucket, values, ``n_rows`` and
    the merged accumulators."""
    starts = bucket_starts(rows.column("window_start"), grain_s)
    rows = rows.drop_columns(["window_start"]).append_column("window_start", starts)
    merged = merge_groups(rows, [*by, "window_start"], entries)
    end = pc.add(merged.column("window_start").cast(pa.int64()), grain_s * _US).cast(TS)
    out = merged.append_column("window_end", end)
    for name, values in value_columns(merged, entries).items():
        out = out.append_column(name, values)
    return out


def merge_groups(rows: pa.Table, keys: list[str], entries: Sequence[BoundAggregate]) -> pa.Table:
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


def value_columns(merged: pa.Table, entries: Sequence[BoundAggregate]) -> dict[str, pa.Array]:
    """Each aggregate's value from its merged accumulator columns."""
    out: dict[str, pa.Array] = {}
    for entry in entries:
        fn, acc_columns = entry.function, entry.acc_columns
        cells = [merged.column(c).to_pylist() for c in acc_columns]
        out[entry.name] = pa.array([fn.get_value(fn.decode([col[i] for col in cells]))
                                    for i in range(merged.num_rows)])
    return out
