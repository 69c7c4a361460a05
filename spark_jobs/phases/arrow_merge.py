"""Merge stored accumulators into coarser buckets, in Arrow on the driver: the rollups' algebra. ``aggregates`` keeps
every key's and window's accumulators, so a week of distinct users is a merge of hourly HLL sketches, not a
recomputation. The ad-hoc ``inspect rollup`` and the declared rollup tables both merge here."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.aggregates.builtins import Builtin
from spark_jobs.aggregates.contract import AggregateFunction, BoundAggregate
from spark_jobs.lake.layout import ADOPTED, SPEC_VERSION
from spark_jobs.windows.kind import EPOCH, TS, epoch_micros, ticks

__all__ = ["MONDAY", "Merged", "Stored", "bucket_floor", "bucket_origin", "bucket_starts", "encoded_columns",
           "merge_groups", "value_columns"]

WEEK = 7 * 86_400
MONDAY = dt.datetime(1970, 1, 5, tzinfo=dt.UTC)
_US = 1_000_000


def bucket_origin(grain_s: int) -> dt.datetime:
    """Where buckets of ``grain_s`` start: the epoch, as Spark's windows, but weeks on a Monday (it was a Thursday)."""
    return MONDAY if grain_s % WEEK == 0 else EPOCH


def bucket_floor(t: dt.datetime, grain_s: int) -> dt.datetime:
    """The start of the bucket of ``grain_s`` holding ``t`` (aware)."""
    origin = bucket_origin(grain_s)
    return origin + (t - origin) // dt.timedelta(seconds=grain_s) * dt.timedelta(seconds=grain_s)


def bucket_starts(window_start: pa.ChunkedArray | pa.Array, grain_s: int) -> pa.Array:
    """Each window's bucket start, vectorised (integer floor: exact at any range)."""
    origin, grain = epoch_micros(bucket_origin(grain_s)), grain_s * _US
    return pa.array((ticks(window_start) - origin) // grain * grain + origin).cast(TS)


@dataclass(frozen=True)
class Stored:
    """Merged accumulators kept as their stored columns (``merge_groups_stored``), one row per group."""

    columns: list[pa.Array]

    def filter(self, mask: pa.Array) -> Stored:
        return Stored([c.filter(mask) for c in self.columns])


Merged = dict[str, "list[Any] | Stored"]


def merge_groups(rows: pa.Table, keys: list[str], entries: Sequence[BoundAggregate],
                 extra: Sequence[tuple[str, str]] = (), order: Sequence[str] = ()) -> tuple[pa.Table, Merged]:
    """One row per ``keys``: ``n_rows``, the plain folds' columns (``arrow_merge``: counts, sums, min, max), the oldest
    ``spec_version`` and the ``extra`` (column, Arrow aggregation) pairs, by Arrow's hash aggregation. Every other
    aggregate's merged accumulators, one per row, are in the dict by name: from its column-wise ``merge_groups_stored``
    or ``merge_groups`` (a DataSketches union per group, first/last by an Arrow sort) where it has one, else
    ``decode``/``merge_all`` per group (sets, a user-defined ``merge``)."""
    if not keys:  # one group of all rows: Arrow's scalar aggregation has no lists, and makes a row of no rows
        table, by_name = merge_groups(rows.append_column("__all", pa.repeat(0, rows.num_rows)), ["__all"], entries,
                                      extra)
        return table.drop_columns(["__all"]), by_name
    fast = [(c, how) for e in entries if e.function.arrow_merge for c, how in zip(e.acc_columns, e.function.arrow_merge,
                                                                                     strict=True)]
    slow = [e for e in entries if not e.function.arrow_merge]
    if SPEC_VERSION in rows.column_names:  # rows from before the lake recorded its spec are its first version
        extra = [*extra, (SPEC_VERSION, "min")]
        rows = rows.set_column(rows.schema.get_field_index(SPEC_VERSION), SPEC_VERSION,
                               pc.fill_null(rows.column(SPEC_VERSION), ADOPTED))
    with_rows = rows.select([*keys, "n_rows", *(c for c, _ in fast), *(c for c, _ in extra)])
    if slow:
        with_rows = with_rows.append_column("__row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    aggs: list[tuple[str, str]] = [("n_rows", "sum"), *fast, *extra] + ([("__row", "list")] if slow else [])
    grouped = with_rows.group_by(keys, use_threads=False).aggregate(aggs)
    grouped = grouped.rename_columns([n.removesuffix("_sum").removesuffix("_min").removesuffix("_max")
                                      .removesuffix("_list") for n in grouped.column_names])
    if order:  # the groups in the order their rows are written: the writer's sort then copies no accumulator
        grouped = grouped.take(pc.sort_indices(grouped, [(c, "ascending") for c in order]))
    if not slow:
        return grouped, {}
    members = grouped.column("__row").combine_chunks()  # each group's rows, in stored order
    offsets = np.zeros(len(members) + 1, dtype=np.int64)
    np.cumsum(members.value_lengths().to_numpy(), out=offsets[1:])
    stored = rows.select([c for e in slow for c in e.acc_columns]).take(members.flatten())
    merged: Merged = {}
    for entry in slow:
        fn = entry.function
        columns = [stored.column(c).combine_chunks() for c in entry.acc_columns]
        if (as_stored := fn.merge_groups_stored(columns, offsets)) is not None:
            merged[entry.name] = Stored(as_stored)
            continue
        if (accs := fn.merge_groups(columns, offsets)) is None:
            decoded = _decoded(fn, columns)
            accs = [fn.merge_all(decoded[lo:hi]) for lo, hi in pairwise(offsets.tolist())]
        if not isinstance(fn, Builtin):  # a user's accumulator, read back as stored (the built-ins' are lossless)
            encoded = [fn.encode(acc) for acc in accs]
            cells = [pa.array([e[j] for e in encoded], rows.schema.field(c).type).to_pylist()
                     for j, c in enumerate(entry.acc_columns)]
            accs = [fn.decode(list(row)) for row in zip(*cells, strict=True)]
        merged[entry.name] = accs
    return grouped.drop_columns(["__row"]), merged


def _decoded(fn: AggregateFunction[Any, Any], columns: Sequence[pa.Array]) -> list[Any]:
    """``fn.decode`` of each row's cells."""
    cells = [_python(c) for c in columns]
    if len(cells) == 1 and type(fn).decode is AggregateFunction.decode:  # the stored value, NULL the empty one
        return [c if c is not None else fn.create_accumulator() for c in cells[0]]
    return [fn.decode(list(row)) for row in zip(*cells, strict=False)]


def _python(array: pa.Array) -> list[Any]:
    """``array.to_pylist()``, built faster: numbers and bytes through NumPy, structs from their fields."""
    kind = array.type
    if pa.types.is_struct(kind):
        names = [f.name for f in kind]
        if len(set(names)) < len(names):
            return array.to_pylist()
        rows = _dicts(names, [_python(f) for f in array.flatten()])
        if not array.null_count:
            return rows
        return [r if ok else None for r, ok in zip(rows, array.is_valid().to_pylist(), strict=True)]
    if ((pa.types.is_integer(kind) or kind in (pa.float32(), pa.float64(), pa.bool_())) and not array.null_count) or (
            pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
            or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        values: list[Any] = array.to_numpy(zero_copy_only=False).tolist()
        return values
    return array.to_pylist()


def _dicts(names: list[str], fields: list[list[Any]]) -> list[dict[str, Any]]:
    """One dict per row from each field's values (dict displays: about twice as fast as ``dict(zip())``)."""
    if len(names) == 1:
        (a,) = names
        return [{a: x} for x in fields[0]]
    if len(names) == 2:
        a, b = names
        return [{a: x, b: y} for x, y in zip(*fields, strict=False)]
    if len(names) == 3:
        a, b, c = names
        return [{a: x, b: y, c: z} for x, y, z in zip(*fields, strict=False)]
    return [dict(zip(names, row, strict=False)) for row in zip(*fields, strict=False)]


def value_columns(table: pa.Table, accs: Merged, entries: Sequence[BoundAggregate],
                  coverage: Mapping[str, int] | None = None) -> dict[str, pa.Array]:
    """Each aggregate's value per row of :func:`merge_groups`' table (NULL where ``coverage`` says the row is older)."""
    out: dict[str, pa.Array] = {}
    for entry in entries:
        fn = entry.function
        merged = accs.get(entry.name)
        if merged is None or isinstance(merged, Stored):
            columns = merged.columns if merged is not None else [table.column(c).combine_chunks()
                                                                  for c in entry.acc_columns]
            if (values := fn.stored_values(columns)) is not None:
                out[entry.name] = values.cast(fn.value_type())
                continue
            merged = _decoded(fn, columns)
        out[entry.name] = pa.array([fn.get_value(acc) for acc in merged], fn.value_type())
    return _masked(out, table, entries, coverage)


def encoded_columns(table: pa.Table, accs: Merged, entries: Sequence[BoundAggregate],
                    schema: pa.Schema, coverage: Mapping[str, int] | None = None) -> dict[str, pa.Array]:
    """Every accumulator column per row of :func:`merge_groups`' table, as ``schema`` stores them (NULL as above)."""
    out: dict[str, pa.Array] = {}
    for entry in entries:
        merged = accs.get(entry.name)
        if merged is None:
            out.update((c, table.column(c).combine_chunks()) for c in entry.acc_columns)
        elif isinstance(merged, Stored):
            out.update((c, a.cast(schema.field(c).type)) for c, a in zip(entry.acc_columns, merged.columns, strict=True))
        else:
            encoded = [entry.function.encode(acc) for acc in merged]
            out.update((c, pa.array([e[j] for e in encoded], schema.field(c).type))
                       for j, c in enumerate(entry.acc_columns))
    return _masked(out, table, entries, coverage)


def _masked(columns: dict[str, pa.Array], table: pa.Table, entries: Sequence[BoundAggregate],
            coverage: Mapping[str, int] | None) -> dict[str, pa.Array]:
    """NULL each aggregate's columns in the rows whose ``spec_version`` is older than the aggregate."""
    if not coverage or SPEC_VERSION not in table.column_names:
        return columns
    versions = table.column(SPEC_VERSION)
    for entry in entries:
        since = coverage.get(entry.name, ADOPTED)
        if since <= ADOPTED:
            continue
        old = pc.fill_null(pc.less(versions, since), False)
        for name in [n for n in (entry.name, *entry.acc_columns) if n in columns]:
            columns[name] = pc.if_else(old, pa.scalar(None, columns[name].type), columns[name])
    return columns
