"""``sum`` and ``avg``: one (sum, non-NULL count) accumulator; the count makes retraction exact."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.aggregates.builtin_base import Builtin, Column, F, builtin
from spark_jobs.aggregates.count import spark_count

__all__ = ["Avg", "Sum"]


@builtin()
class Sum(Builtin):
    fn = "sum"
    acc_fields = ("sum", "count")
    arrow_merge = ("sum", "sum")
    numeric_only = True
    sums_as: ClassVar[str | None] = None  # the Spark type values are summed as (None: Spark's sum type)

    def encode(self, acc: list[Any]) -> list[Any]:
        return list(acc)

    def decode(self, cells: list[Any]) -> list[Any]:
        return [cells[0], cells[1] or 0]  # (sum or NULL, non-NULL count)

    def acc_types(self) -> list[pa.DataType]:
        return [self.value_type(), pa.int64()]

    def value_type(self) -> pa.DataType:  # Spark sums integers as bigint, floats as double
        return pa.int64() if pa.types.is_integer(self.input_arrow) else pa.float64()

    def create_accumulator(self) -> list[Any]:
        return [0, 0]

    def accumulate(self, acc: list[Any], *values: Any) -> list[Any]:
        return acc if values[0] is None else [acc[0] + values[0], acc[1] + 1]

    def retract(self, acc: list[Any], *values: Any) -> list[Any]:
        return acc if values[0] is None else [acc[0] - values[0], acc[1] - 1]

    def merge(self, acc: list[Any], other: list[Any]) -> list[Any]:
        total = acc[0] if other[0] is None else other[0] if acc[0] is None else acc[0] + other[0]  # SQL sum: NULLs skip
        return [total, acc[1] + other[1]]

    def get_value(self, acc: list[Any]) -> Any:
        return acc[0] if acc[1] > 0 else None

    def stored_values(self, columns: Sequence[pa.Array]) -> pa.Array:
        return pc.if_else(_counted(columns), columns[0], pa.scalar(None, columns[0].type))

    def accumulate_batch(self, acc: list[Any], *arrays: pa.Array) -> list[Any]:
        arr = arrays[0]
        n = len(arr) - arr.null_count
        if pa.types.is_integer(arr.type):  # exact, like Python ints: no silent int64 wrap-around
            arr = arr.cast(pa.decimal128(38, 0))
        total = pc.sum(arr).as_py() or 0
        return [acc[0] + (int(total) if isinstance(total, Decimal) else total), acc[1] + n] if n else acc

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        assert value is not None
        summed = value if self.sums_as is None else value.cast(self.sums_as)
        return [F.sum(summed if sign is None else summed * sign), spark_count(value, sign)]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        return [F.sum(accs[0]), F.sum(accs[1])]

    def spark_value(self, accs: list[Column]) -> Column:
        return F.when(accs[1] > 0, accs[0])


@builtin()
class Avg(Sum):
    """``avg``: the same (sum, count) accumulator as ``sum``, summed as double."""

    fn = "avg"
    sums_as = "double"

    def value_type(self) -> pa.DataType:
        return pa.float64()

    def get_value(self, acc: list[Any]) -> float | None:
        return acc[0] / acc[1] if acc[1] > 0 else None

    def stored_values(self, columns: Sequence[pa.Array]) -> pa.Array:
        mean = pc.divide(pc.cast(columns[0], pa.float64()), pc.cast(columns[1], pa.float64()))
        return pc.if_else(_counted(columns), mean, pa.scalar(None, pa.float64()))

    def spark_value(self, accs: list[Column]) -> Column:
        return F.when(accs[1] > 0, accs[0] / accs[1])


def _counted(columns: Sequence[pa.Array]) -> pa.Array:
    """The stored (sum, count) rows that hold a non-NULL value."""
    return pc.fill_null(pc.greater(columns[1], 0), False)
