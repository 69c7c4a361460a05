"""``min`` and ``max`` of a changelog source: a count per value, so retracting the extreme falls back
to the next one."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa

from spark_jobs.aggregates.builtin_base import Builtin, Column, DataFrame, F, builtin

__all__ = ["MaxMapView", "MinMapView"]


class _ExtremeMapView(Builtin):
    """As Flink keeps them with a map view: a ``map<value, bigint>`` column; Min/Max's changelog form."""

    acc_fields = ("counts",)
    map_view = True
    _pick: ClassVar[Any]

    def acc_types(self) -> list[pa.DataType]:
        return [pa.map_(self.input_arrow, pa.int64())]

    def encode(self, acc: dict[Any, int]) -> list[Any]:  # no counts left: NULL, as the Spark merge leaves it
        return [sorted(acc.items(), key=lambda kv: (type(kv[0]).__name__, kv[0]))] if acc else [None]

    def decode(self, cells: list[Any]) -> dict[Any, int]:
        return dict(cells[0] or ())

    def create_accumulator(self) -> dict[Any, int]:
        return {}

    def _add(self, acc: dict[Any, int], value: Any, n: int) -> dict[Any, int]:
        if value is None:
            return acc
        acc = {**acc, value: acc.get(value, 0) + n}
        if not acc[value]:
            del acc[value]
        return acc

    def accumulate(self, acc: dict[Any, int], *values: Any) -> dict[Any, int]:
        return self._add(acc, values[0], 1)

    def retract(self, acc: dict[Any, int], *values: Any) -> dict[Any, int]:
        return self._add(acc, values[0], -1)

    def merge(self, acc: dict[Any, int], other: dict[Any, int]) -> dict[Any, int]:
        for value, n in dict(other).items():
            acc = self._add(acc, value, n)
        return acc

    def get_value(self, acc: dict[Any, int]) -> Any:
        present = [v for v, n in acc.items() if n > 0]
        return type(self)._pick(present) if present else None

    def spark_value(self, accs: list[Column]) -> Column:
        present = F.map_keys(F.map_filter(accs[0], lambda _, n: n > 0))
        return F.array_min(present) if self._pick is min else F.array_max(present)

    def spark_partial_frame(self, rows: DataFrame, keys: list[str], sign: str, acc: str) -> DataFrame:
        """Per key, a map of value -> signed count (``sign`` is -1 on -U/-D rows)."""
        column = self.columns[0]
        counts = (rows.where(F.col(column).isNotNull()).groupBy(*keys, F.col(column).alias("_v"))
                  .agg(F.sum(sign).cast("bigint").alias("_n")).where(F.col("_n") != 0))
        return counts.groupBy(*keys).agg(F.map_from_entries(F.collect_list(F.struct("_v", "_n"))).alias(acc))

    def spark_merge_frame(self, partials: DataFrame, keys: list[str], acc: str) -> DataFrame:
        entries = partials.select(*keys, F.explode(acc).alias("_v", "_n"))
        counts = entries.groupBy(*keys, "_v").agg(F.sum("_n").alias("_n")).where(F.col("_n") != 0)
        return counts.groupBy(*keys).agg(F.map_from_entries(F.collect_list(F.struct("_v", "_n"))).alias(acc))


@builtin(changelog_form=True)
class MinMapView(_ExtremeMapView):
    fn = "min"
    _pick = min


@builtin(changelog_form=True)
class MaxMapView(_ExtremeMapView):
    fn = "max"
    _pick = max
