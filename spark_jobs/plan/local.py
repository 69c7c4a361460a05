"""Merge accumulator rows on the driver with the aggregates' own Python algebra.

A small mini-batch touches a few thousand keys: merging their accumulators in Spark costs
seconds of planning and job scheduling for milliseconds of work. Here accumulator rows, as
``partials`` and the stream's state store them (plain Python values of their Arrow
columns), are decoded into each aggregate's accumulator, merged with its ``merge`` and
read with its ``get_value``: the reference algebra that the Spark phases compile to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import datasketches as ds

from spark_jobs.aggregates.builtins import (
    ApproxCountDistinct,
    ApproxPercentile,
    Builtin,
    CountDistinct,
    _ByEventTime,
    _ExtremeMapView,
)
from spark_jobs.plan.phases import CompiledAggregates

__all__ = ["LocalAggregates"]


class LocalAggregates:
    """A spec's aggregates over accumulator rows (``dict`` of column -> value), in spec order."""

    def __init__(self, compiled: CompiledAggregates) -> None:
        self.compiled = compiled
        self.names = compiled.value_names
        self._entries: list[tuple[Any, list[str]]] = []
        for _, impl in compiled.entries:
            if isinstance(impl, Builtin):
                self._entries.append((impl, impl.acc_columns()))
            else:
                self._entries.append((impl.function, [impl.acc_column]))

    def decode(self, row: Mapping[str, Any]) -> list[Any]:
        """Fresh accumulators of one row (merges may mutate them)."""
        return [_decode(impl, [row[c] for c in columns]) for impl, columns in self._entries]

    def merge(self, accs: list[Any], other: list[Any]) -> list[Any]:
        return [impl.merge(a, b) for (impl, _), a, b in zip(self._entries, accs, other, strict=True)]

    def merge_rows(self, rows: Iterable[Mapping[str, Any]]) -> list[Any]:
        """Merged accumulators of several rows of one key (at least one)."""
        out: list[Any] | None = None
        for row in rows:
            accs = self.decode(row)
            out = accs if out is None else self.merge(out, accs)
        assert out is not None, "merge_rows needs at least one row"
        return out

    def encode(self, accs: list[Any]) -> dict[str, Any]:
        """Accumulator columns, as Spark's phases store them."""
        out: dict[str, Any] = {}
        for (impl, columns), acc in zip(self._entries, accs, strict=True):
            out.update(zip(columns, _encode(impl, acc), strict=True))
        return out

    def values(self, accs: list[Any]) -> dict[str, Any]:
        return {name: impl.get_value(acc) for name, (impl, _), acc in zip(self.names, self._entries, accs, strict=True)}


def _decode(impl: Any, cells: list[Any]) -> Any:
    if isinstance(impl, ApproxCountDistinct):
        return ds.hll_sketch.deserialize(cells[0]) if cells[0] is not None else impl.create_accumulator()
    if isinstance(impl, ApproxPercentile):
        return ds.kll_doubles_sketch.deserialize(cells[0]) if cells[0] is not None else impl.create_accumulator()
    if isinstance(impl, CountDistinct):
        return set(cells[0] or ())
    if isinstance(impl, _ExtremeMapView):
        return dict(cells[0] or ())
    if isinstance(impl, _ByEventTime):
        return None if cells[0] is None else (cells[0]["at"], cells[0]["value"])
    if isinstance(impl, Builtin):
        if len(cells) == 1:  # count, min, max: the accumulator is the column
            return cells[0] if cells[0] is not None or impl.fn != "count" else 0
        return [cells[0], cells[1] or 0]  # sum, avg: (sum or NULL, non-NULL count)
    return cells[0] if cells[0] is not None else impl.create_accumulator()  # user-defined: its Arrow value


def _encode(impl: Any, acc: Any) -> list[Any]:
    if isinstance(impl, ApproxCountDistinct):
        return [acc.serialize_compact()]
    if isinstance(impl, ApproxPercentile):
        return [acc.serialize()]
    if isinstance(impl, CountDistinct):
        return [sorted(acc, key=lambda v: (type(v).__name__, v))]
    if isinstance(impl, _ExtremeMapView):  # no counts left: NULL, as Spark's keyed merge leaves it
        return [sorted(acc.items(), key=lambda kv: (type(kv[0]).__name__, kv[0]))] if acc else [None]
    if isinstance(impl, _ByEventTime):
        return [None if acc is None else {"at": acc[0], "value": acc[1]}]
    if isinstance(impl, Builtin) and isinstance(acc, list):
        return list(acc)
    return [acc]
