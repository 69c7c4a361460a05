"""``min`` and ``max`` of an append-only source: the accumulator is the extreme itself (see
:mod:`spark_jobs.aggregates.extremes_map_view` for a changelog source)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.aggregates.builtin_base import Builtin, Column, F, builtin

__all__ = ["Max", "Min"]


class _Extreme(Builtin):
    acc_fields = ("value",)
    _pick: ClassVar[Any]

    def create_accumulator(self) -> Any:
        return None

    def accumulate(self, acc: Any, *values: Any) -> Any:
        v = values[0]
        return acc if v is None else v if acc is None else type(self)._pick(acc, v)

    def merge(self, acc: Any, other: Any) -> Any:
        return self.accumulate(acc, other)

    def get_value(self, acc: Any) -> Any:
        return acc

    def stored_values(self, columns: Sequence[pa.Array]) -> pa.Array:
        return columns[0]

    def accumulate_batch(self, acc: Any, *arrays: pa.Array) -> Any:
        return self.accumulate(acc, pc.min_max(arrays[0])[self.fn].as_py())

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        assert value is not None
        return self.spark_merge([value])

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        return [F.min(accs[0]) if self._pick is min else F.max(accs[0])]


@builtin()
class Min(_Extreme):
    fn = "min"
    _pick = min
    arrow_merge = ("min",)


@builtin()
class Max(_Extreme):
    fn = "max"
    _pick = max
    arrow_merge = ("max",)
