"""``count``: of rows, or of a column's non-NULL values; it retracts, so it serves changelog sources too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.aggregates.builtin_base import Builtin, Column, F, builtin

__all__ = ["Count", "spark_count"]


def spark_count(value: Column | None, sign: Column | None) -> Column:
    """The rows (``value``'s non-NULL ones), each counted as its ``sign`` (-1 for -U/-D) when there is one."""
    if sign is not None:
        return F.sum(sign if value is None else F.when(value.isNotNull(), sign).otherwise(0))  # ints: a bigint
    return F.count(F.lit(1)) if value is None else F.count(value)


@builtin()
class Count(Builtin):
    fn = "count"
    acc_fields = ("count",)
    arrow_merge = ("sum",)
    column_required = False
    result_type = pa.int64()

    def create_accumulator(self) -> int:
        return 0

    def accumulate(self, acc: int, *values: Any) -> int:
        return acc + (1 if not values or values[0] is not None else 0)

    def retract(self, acc: int, *values: Any) -> int:
        return acc - (1 if not values or values[0] is not None else 0)

    def merge(self, acc: int, other: int) -> int:
        return acc + other

    def get_value(self, acc: int) -> int:
        return acc

    def stored_values(self, columns: Sequence[pa.Array]) -> pa.Array:
        return pc.fill_null(columns[0], 0)  # NULL is the empty count

    def accumulate_batch(self, acc: int, *arrays: pa.Array) -> int:
        if not arrays:
            raise ValueError("count(*) over arrays needs the row count; pass any column of the batch")
        return acc + (len(arrays[0]) if not self.columns else len(arrays[0]) - arrays[0].null_count)

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        return [spark_count(value, sign)]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        return [F.sum(accs[0])]
