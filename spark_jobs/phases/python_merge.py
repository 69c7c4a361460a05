"""Merge accumulator rows on the driver with the aggregates' own Python algebra: for a small mini-batch's few thousand
keys, Spark costs seconds of planning and scheduling for milliseconds of work. Each aggregate decodes the stored rows,
merges them with its ``merge_all`` (what Spark's phases compile to) and reads them with ``get_value``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from spark_jobs.lake.layout import ADOPTED, SPEC_VERSION
from spark_jobs.phases.compiled import CompiledAggregates

__all__ = ["LocalAggregates"]


class LocalAggregates:
    """A spec's aggregates over accumulator rows (``dict`` of column -> value), in spec order."""

    def __init__(self, compiled: CompiledAggregates) -> None:
        self.compiled = compiled
        self.names = compiled.value_names
        self._entries = [(b.function, b.acc_columns) for b in compiled.entries]
        self._since = [compiled.coverage[n] for n in self.names]

    @staticmethod
    def version(rows: Iterable[Mapping[str, Any]]) -> int:
        """The oldest spec version among rows (their merge covers what all of them hold)."""
        return min(ADOPTED if r.get(SPEC_VERSION) is None else int(r[SPEC_VERSION]) for r in rows)

    def decode(self, row: Mapping[str, Any]) -> list[Any]:
        """Fresh accumulators of one row (merges may mutate them)."""
        return [fn.decode([row[c] for c in columns]) for fn, columns in self._entries]

    def merge_rows(self, rows: Iterable[Mapping[str, Any]]) -> list[Any]:
        """Merged accumulators of several rows of one key (at least one)."""
        decoded = [self.decode(row) for row in rows]
        assert decoded, "merge_rows needs at least one row"
        return [fn.merge_all([accs[j] for accs in decoded]) for j, (fn, _) in enumerate(self._entries)]

    def encode(self, accs: list[Any], version: int = ADOPTED) -> dict[str, Any]:
        """Accumulator columns, as Spark's phases store them (NULL for aggregates newer than ``version``)."""
        return {column: cell for (fn, columns), acc, since in zip(self._entries, accs, self._since, strict=True)
                for column, cell in zip(columns, fn.encode(acc) if version >= since else [None] * len(columns),
                                        strict=True)}

    def values(self, accs: list[Any], version: int = ADOPTED) -> dict[str, Any]:
        """Each aggregate's value (NULL for aggregates newer than ``version``: the rows lack part of it)."""
        return {name: fn.get_value(acc) if version >= since else None
                for name, (fn, _), acc, since in zip(self.names, self._entries, accs, self._since, strict=True)}
