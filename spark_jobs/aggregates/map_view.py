"""A count per value, as Flink's MapView keeps it: the accumulator of the aggregates that must retract a value
exactly from a changelog source (``min``, ``max``, ``count_distinct``). A value is present while its count is > 0;
partials may hold negative counts (a retraction combined in a later batch than its row), which a merge cancels."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from spark_jobs.aggregates.builtin_base import Builtin, Column, DataFrame, F

__all__ = ["CountsMapView"]


class CountsMapView(Builtin):
    """A ``map<value, bigint>`` column of non-zero counts; subclasses say what value the present keys give."""

    acc_fields = ("counts",)
    map_view = True

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

    @staticmethod
    def present(acc: dict[Any, int]) -> list[Any]:
        """The values whose count is > 0: the live rows' values."""
        return [v for v, n in acc.items() if n > 0]

    @staticmethod
    def spark_present(counts: Column) -> Column:
        """``present`` in Spark: the keys of the map whose count is > 0 (NULL for a NULL map)."""
        return F.map_keys(F.map_filter(counts, lambda _, n: n > 0))

    def spark_partial_frame(self, rows: DataFrame, keys: list[str], sign: str, acc: str) -> DataFrame:
        """Per key, a map of value -> signed count (``sign`` is -1 on -U/-D rows)."""
        column = self.columns[0]
        counts = (rows.where(F.col(column).isNotNull()).groupBy(*keys, F.col(column).alias("_v"))
                  .agg(F.sum(sign).cast("bigint").alias("_n")).where(F.col("_n") != 0))
        return counts.groupBy(*keys).agg(F.map_from_entries(F.collect_list(F.struct("_v", "_n"))).alias(acc))

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        """Partial maps summed per value in the key's own aggregation (no join); no count left: NULL."""
        from pyspark.sql.pandas.types import from_arrow_type

        zero = F.create_map().cast(from_arrow_type(self.acc_types()[0]))
        summed = F.aggregate(F.collect_list(accs[0]), zero, lambda acc, m: F.map_zip_with(
            acc, m, lambda _, a, b: F.coalesce(a, F.lit(0)) + F.coalesce(b, F.lit(0))))
        live = F.map_filter(summed, lambda _, n: n != 0)
        return [F.when(F.size(live) > 0, live)]
