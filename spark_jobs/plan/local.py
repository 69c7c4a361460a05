"""Merge accumulator rows on the driver with the aggregates' own Python algebra.

A small mini-batch touches a few thousand keys: merging their accumulators in Spark costs
seconds of planning and job scheduling for milliseconds of work. Here accumulator rows, as
``partials`` and the stream's state store them (Python values of their Arrow columns), are
decoded by each aggregate, merged with its ``merge_all`` (the definition Spark's phases compile
to, and the one the Arrow UDAF path calls) and read with its ``get_value``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from spark_jobs.plan.phases import CompiledAggregates

__all__ = ["LocalAggregates"]


class LocalAggregates:
    """A spec's aggregates over accumulator rows (``dict`` of column -> value), in spec order."""

    def __init__(self, compiled: CompiledAggregates) -> None:
        self.compiled = compiled
        self.names = compiled.value_names
        self._entries = [(b.function, b.acc_columns) for b in compiled.entries]

    def decode(self, row: Mapping[str, Any]) -> list[Any]:
        """Fresh accumulators of one row (merges may mutate them)."""
        return [fn.decode([row[c] for c in columns]) for fn, columns in self._entries]

    def merge_rows(self, rows: Iterable[Mapping[str, Any]]) -> list[Any]:
        """Merged accumulators of several rows of one key (at least one)."""
        decoded = [self.decode(row) for row in rows]
        assert decoded, "merge_rows needs at least one row"
        return [fn.merge_all([accs[j] for accs in decoded]) for j, (fn, _) in enumerate(self._entries)]

    def encode(self, accs: list[Any]) -> dict[str, Any]:
        """Accumulator columns, as Spark's phases store them."""
        out: dict[str, Any] = {}
        for (fn, columns), acc in zip(self._entries, accs, strict=True):
            out.update(zip(columns, fn.encode(acc), strict=True))
        return out

    def values(self, accs: list[Any]) -> dict[str, Any]:
        return {name: fn.get_value(acc) for name, (fn, _), acc in zip(self.names, self._entries, accs, strict=True)}
