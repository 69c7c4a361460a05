"""Exact ``count_distinct``: the accumulator is the set of values, stored as an array column."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.aggregates.builtin_base import Builtin, Column, F, builtin

__all__ = ["CountDistinct"]


@builtin()
class CountDistinct(Builtin):
    fn = "count_distinct"
    acc_fields = ("set",)
    result_type = pa.int64()

    def acc_types(self) -> list[pa.DataType]:
        return [pa.list_(pa.field("element", self.input_arrow))]

    def encode(self, acc: set[Any]) -> list[Any]:
        return [sorted(acc, key=lambda v: (type(v).__name__, v))]

    def decode(self, cells: list[Any]) -> set[Any]:
        return set(cells[0] or ())

    def create_accumulator(self) -> set[Any]:
        return set()

    def accumulate(self, acc: set[Any], *values: Any) -> set[Any]:
        if values[0] is not None:
            acc.add(values[0])
        return acc

    def merge(self, acc: set[Any], other: set[Any]) -> set[Any]:
        return acc | set(other)

    def get_value(self, acc: set[Any]) -> int:
        return len(acc)

    def accumulate_batch(self, acc: set[Any], *arrays: pa.Array) -> set[Any]:
        acc.update(pc.unique(arrays[0].drop_null()).to_pylist())
        return acc

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        assert value is not None
        return [F.collect_set(value)]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        return [F.array_distinct(F.flatten(F.collect_list(accs[0])))]

    def spark_value(self, accs: list[Column]) -> Column:
        return F.size(accs[0]).cast("bigint")
