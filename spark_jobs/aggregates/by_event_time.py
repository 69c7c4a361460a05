"""``first`` and ``last``: the non-NULL value at the earliest (latest) event time, ties to the smaller (larger)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.aggregates.builtin_base import Builtin, Column, F, builtin

__all__ = ["First", "Last"]


class _ByEventTime(Builtin):
    """The accumulator is the struct (event time, value): ordered structs make both phases a plain ``min``/``max``."""

    _pick: ClassVar[Any]

    def acc_types(self) -> list[pa.DataType]:
        return [pa.struct([("at", pa.timestamp("us", tz="UTC")), ("value", self.input_arrow)])]

    def encode(self, acc: tuple[Any, Any] | None) -> list[Any]:
        return [None if acc is None else {"at": acc[0], "value": acc[1]}]

    def decode(self, cells: list[Any]) -> tuple[Any, Any] | None:
        return None if cells[0] is None else (cells[0]["at"], cells[0]["value"])

    def create_accumulator(self) -> tuple[Any, Any] | None:
        return None

    def accumulate(self, acc: tuple[Any, Any] | None, *values: Any) -> tuple[Any, Any] | None:
        value, at = values
        if value is None or at is None:
            return acc
        return (at, value) if acc is None else type(self)._pick(acc, (at, value))

    def merge(self, acc: tuple[Any, Any] | None, other: tuple[Any, Any] | None) -> tuple[Any, Any] | None:
        return acc if other is None else self.accumulate(acc, other[1], other[0])

    def get_value(self, acc: tuple[Any, Any] | None) -> Any:
        return None if acc is None else acc[1]

    def merge_groups(self, columns: Sequence[pa.Array], offsets: np.ndarray) -> list[tuple[Any, Any] | None] | None:
        stored = self.merge_groups_stored(columns, offsets)
        return None if stored is None else [self.decode([cell]) for cell in stored[0].to_pylist()]

    def merge_groups_stored(self, columns: Sequence[pa.Array], offsets: np.ndarray) -> list[pa.Array] | None:
        """Column-wise, as stored: per group the earliest (latest) time, then the smallest (largest) value at it:
        the tuples' ``min``/``max`` order, for times as timestamps and values Arrow and Python order alike (integers,
        strings, binary, booleans, dates, times, timestamps); else None."""
        acc = columns[0].combine_chunks() if isinstance(columns[0], pa.ChunkedArray) else columns[0]
        if (not pa.types.is_struct(acc.type) or [f.name for f in acc.type] != ["at", "value"]
                or not (pa.types.is_timestamp(acc.type.field("at").type) and _orders_as_python(acc.type.field("at").type))
                or not _orders_as_python(acc.type.field("value").type)):
            return None
        groups = len(offsets) - 1
        if groups == 0:
            return [acc.slice(0, 0)]
        at, value = acc.flatten()
        if pc.any(pc.and_(acc.is_valid(), pc.or_(at.is_null(), value.is_null()))).as_py():
            return None  # a stored (time, NULL) or (NULL, value): leave it to the tuples
        valid = np.asarray(acc.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        earliest = type(self)._pick is min
        how, sentinel = ("min", np.iinfo(np.int64).max) if earliest else ("max", np.iinfo(np.int64).min)
        ticks = np.where(valid, at.cast(pa.int64()).fill_null(0).to_numpy(), sentinel)
        starts = offsets[:-1]
        best = (np.minimum if earliest else np.maximum).reduceat(ticks, starts)
        present = np.add.reduceat(valid.astype(np.int64), starts) > 0
        group = np.repeat(np.arange(groups, dtype=np.int64), np.diff(offsets))
        tied = valid & (ticks == best[group])
        try:
            picked = (pa.table({"g": group[tied], "v": value.filter(pa.array(tied))})
                      .group_by("g", use_threads=False).aggregate([("v", how)]))
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        where = np.zeros(groups, dtype=np.int64)  # each present group's row of ``picked``
        where[picked.column("g").to_numpy()] = np.arange(picked.num_rows)
        values = picked.column(f"v_{how}").combine_chunks().take(pa.array(where, mask=~present))
        times = pa.array(best, pa.int64(), mask=~present).cast(acc.type.field("at").type)
        return [pa.StructArray.from_arrays([times, values.cast(acc.type.field("value").type)], fields=list(acc.type),
                                           mask=pa.array(~present))]

    def stored_values(self, columns: Sequence[pa.Array]) -> pa.Array:
        """``get_value`` of each stored accumulator, column-wise: its value (NULL where it is NULL)."""
        acc = columns[0].combine_chunks() if isinstance(columns[0], pa.ChunkedArray) else columns[0]
        return pc.if_else(acc.is_valid(), acc.field("value"), pa.scalar(None, acc.type.field("value").type))

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        assert value is not None
        return self.spark_merge([F.when(value.isNotNull() & event_time.isNotNull(),
                                        F.struct(event_time.alias("at"), value.alias("value")))])

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        return [F.min(accs[0]) if self._pick is min else F.max(accs[0])]

    def spark_value(self, accs: list[Column]) -> Column:
        return accs[0].getField("value")


@builtin()
class First(_ByEventTime):
    fn = "first"
    _pick = min


@builtin()
class Last(_ByEventTime):
    fn = "last"
    _pick = max


def _orders_as_python(type_: pa.DataType) -> bool:
    """Whether Arrow's min/max order values of this type as Python's comparisons order their Python
    values: not floats (NaN), nor nanosecond times or ``date64`` (their Python values are truncated)."""
    if pa.types.is_timestamp(type_) or pa.types.is_time(type_):
        return type_.unit != "ns"
    return (pa.types.is_integer(type_) or pa.types.is_string(type_) or pa.types.is_large_string(type_)
            or pa.types.is_binary(type_) or pa.types.is_large_binary(type_) or pa.types.is_boolean(type_)
            or pa.types.is_date32(type_))
