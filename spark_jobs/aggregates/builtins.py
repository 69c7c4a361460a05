"""Built-in aggregates: each one is its algebra in Python and its two phases in Spark.

Adding a built-in is one class here, registered with ``@builtin``: its algebra, its stored
columns (``acc_fields``, ``encode``/``decode``) and its Spark phases. The Python side
(``create_accumulator`` ... ``get_value``) is the reference, testable without Spark, and what
the stream's driver engine merges with. The Spark side compiles the same algebra to native expressions:
``spark_partial`` (combine: raw rows -> accumulator columns), ``spark_merge`` (reduce:
accumulator columns -> merged accumulator columns) and ``spark_value`` (accumulators ->
result). Accumulators are stored as plain columns: numbers as numbers, sets as arrays,
sketches as Apache DataSketches' standard serialized bytes (HLL_8, KLL doubles), so any
Delta reader can use them.

SQL NULL semantics: NULL inputs are ignored; an aggregate over no non-NULL input is NULL,
except the counts, which are 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import datasketches as ds
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.aggregates.base import AggregateFunction

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "BUILTINS",
    "ApproxCountDistinct",
    "ApproxPercentile",
    "Avg",
    "Builtin",
    "Count",
    "CountDistinct",
    "First",
    "Last",
    "Max",
    "MaxMapView",
    "Min",
    "MinMapView",
    "RETRACTING",
    "Sum",
    "builtin",
]

NUMERIC = ("int", "bigint", "float", "double")
# Spark SQL type of a source column (spec.TYPES' values) -> the Arrow type its values are stored as
ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "float": pa.float32(), "double": pa.float64(),
    "boolean": pa.bool_(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
}


class Builtin(AggregateFunction[Any, Any]):
    """A built-in aggregate bound to its output name, input columns, args and input column type."""

    fn: ClassVar[str]
    column_required: ClassVar[bool] = True
    numeric_only: ClassVar[bool] = False
    args_allowed: ClassVar[tuple[str, ...]] = ()
    uses_event_time: ClassVar[bool] = False
    map_view: ClassVar[bool] = False  # its phases are keyed aggregations (spark_*_frame), not expressions

    def __init__(self, name: str, columns: Sequence[str] = (), args: Mapping[str, Any] | None = None,
                 input_type: str | None = None) -> None:
        self.name = name
        self.columns = tuple(columns)
        self.args = dict(args or {})
        self.input_type = input_type

    def arg(self, key: str, default: Any = None) -> Any:
        return self.args.get(key, default)

    # stored types: Spark's phases produce these (tests/integration/test_stored_types.py holds them to it)
    @property
    def input_arrow(self) -> pa.DataType:
        """The Arrow type of the input column (double when there is none)."""
        return ARROW_TYPES.get(self.input_type or "double", pa.float64())

    def acc_types(self) -> list[pa.DataType]:
        return [self.input_arrow]

    def value_type(self) -> pa.DataType:
        return self.input_arrow

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> list[tuple[str, str]]:
        """Problems with ``args`` as (field, message); subclasses add range checks."""
        return [
            ("args", f"unknown argument {k!r} for {cls.fn}; allowed: {', '.join(cls.args_allowed) or 'none'}")
            for k in args
            if k not in cls.args_allowed
        ]

    # Spark phases ------------------------------------------------------------
    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        """Accumulator expressions over raw rows; ``sign`` (-1 for -U/-D rows) only for retracting ones."""
        raise NotImplementedError

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        raise NotImplementedError

    def spark_value(self, accs: list[Column]) -> Column:
        return accs[0]

    # keyed phases, for ``map_view`` aggregates whose phases are aggregations of their own
    def spark_partial_frame(self, rows: DataFrame, keys: list[str], sign: str, acc: str) -> DataFrame:
        raise NotImplementedError

    def spark_merge_frame(self, partials: DataFrame, keys: list[str], acc: str) -> DataFrame:
        raise NotImplementedError


B = TypeVar("B", bound=type[Builtin])
BUILTINS: dict[str, type[Builtin]] = {}
# what ``fn`` resolves to when the source is a changelog (source.op_column): the retracting forms
RETRACTING: dict[str, type[Builtin]] = {}


def builtin(*, changelog_form: bool = False) -> Callable[[B], B]:
    """Register a built-in under its ``fn``. ``changelog_form``: it replaces the plain one for a
    changelog source; a plain one that can retract serves both."""

    def register(cls: B) -> B:
        if changelog_form:
            RETRACTING[cls.fn] = cls
            return cls
        BUILTINS[cls.fn] = cls
        if cls.retract is not AggregateFunction.retract:
            RETRACTING.setdefault(cls.fn, cls)
        return cls

    return register


@builtin()
class Count(Builtin):
    """``count`` of rows, or of non-NULL values when a column is given."""

    fn = "count"
    acc_fields = ("count",)

    def acc_types(self) -> list[pa.DataType]:
        return [pa.int64()]

    def value_type(self) -> pa.DataType:
        return pa.int64()
    arrow_merge = ("sum",)
    column_required = False

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

    def accumulate_batch(self, acc: int, *arrays: pa.Array) -> int:
        if not arrays:
            raise ValueError("count(*) over arrays needs the row count; pass any column of the batch")
        return acc + (len(arrays[0]) if not self.columns else len(arrays[0]) - arrays[0].null_count)

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        from pyspark.sql import functions as F

        if sign is not None:
            return [F.sum(sign if value is None else F.when(value.isNotNull(), sign).otherwise(0)).cast("bigint")]
        return [F.count(F.lit(1)) if value is None else F.count(value)]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.sum(accs[0])]


@builtin()
class Sum(Builtin):
    """``sum``: accumulator (sum, non-NULL count); the count makes retraction exact."""

    fn = "sum"
    acc_fields = ("sum", "count")
    arrow_merge = ("sum", "sum")
    numeric_only = True

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
        if values[0] is not None:
            acc = [acc[0] + values[0], acc[1] + 1]
        return acc

    def retract(self, acc: list[Any], *values: Any) -> list[Any]:
        if values[0] is not None:
            acc = [acc[0] - values[0], acc[1] - 1]
        return acc

    def merge(self, acc: list[Any], other: list[Any]) -> list[Any]:
        total = acc[0] if other[0] is None else other[0] if acc[0] is None else acc[0] + other[0]  # SQL sum: NULLs skip
        return [total, acc[1] + other[1]]

    def get_value(self, acc: list[Any]) -> Any:
        return acc[0] if acc[1] > 0 else None

    def accumulate_batch(self, acc: list[Any], *arrays: pa.Array) -> list[Any]:
        arr = arrays[0]
        n = len(arr) - arr.null_count
        if pa.types.is_integer(arr.type):  # exact, like Python ints: no silent int64 wrap-around
            arr = arr.cast(pa.decimal128(38, 0))
        total = pc.sum(arr).as_py() or 0
        return [acc[0] + (int(total) if isinstance(total, Decimal) else total), acc[1] + n] if n else acc

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        from pyspark.sql import functions as F

        assert value is not None
        if sign is not None:
            return [F.sum(value * sign), F.sum(F.when(value.isNotNull(), sign).otherwise(0)).cast("bigint")]
        return [F.sum(value), F.count(value)]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.sum(accs[0]), F.sum(accs[1])]

    def spark_value(self, accs: list[Column]) -> Column:
        from pyspark.sql import functions as F

        return F.when(accs[1] > 0, accs[0])


@builtin()
class Avg(Sum):
    """``avg``: the same (sum, count) accumulator as ``sum``, summed as double."""

    fn = "avg"

    def acc_types(self) -> list[pa.DataType]:
        return [pa.float64(), pa.int64()]

    def value_type(self) -> pa.DataType:
        return pa.float64()

    def get_value(self, acc: list[Any]) -> float | None:
        return acc[0] / acc[1] if acc[1] > 0 else None

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        from pyspark.sql import functions as F

        assert value is not None
        if sign is not None:
            return [F.sum(value.cast("double") * sign), F.sum(F.when(value.isNotNull(), sign).otherwise(0)).cast("bigint")]
        return [F.sum(value.cast("double")), F.count(value)]

    def spark_value(self, accs: list[Column]) -> Column:
        from pyspark.sql import functions as F

        return F.when(accs[1] > 0, accs[0] / accs[1])


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

    def accumulate_batch(self, acc: Any, *arrays: pa.Array) -> Any:
        return self.accumulate(acc, pc.min_max(arrays[0])[self.fn].as_py())


@builtin()
class Min(_Extreme):
    fn = "min"
    _pick = min
    arrow_merge = ("min",)

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        from pyspark.sql import functions as F

        assert value is not None
        return [F.min(value)]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.min(accs[0])]


@builtin()
class Max(_Extreme):
    fn = "max"
    _pick = max
    arrow_merge = ("max",)

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        from pyspark.sql import functions as F

        assert value is not None
        return [F.max(value)]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.max(accs[0])]


@builtin()
class CountDistinct(Builtin):
    """Exact ``count_distinct``: the accumulator is the set of values (an array column)."""

    fn = "count_distinct"
    acc_fields = ("set",)

    def acc_types(self) -> list[pa.DataType]:
        return [pa.list_(pa.field("element", self.input_arrow))]

    def value_type(self) -> pa.DataType:
        return pa.int64()

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
        acc.update(v for v in pc.unique(arrays[0].drop_null()).to_pylist())
        return acc

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        from pyspark.sql import functions as F

        assert value is not None
        return [F.collect_set(value)]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.array_distinct(F.flatten(F.collect_list(accs[0])))]

    def spark_value(self, accs: list[Column]) -> Column:
        from pyspark.sql import functions as F

        return F.size(accs[0]).cast("bigint")


@builtin()
class ApproxCountDistinct(Builtin):
    """HyperLogLog (DataSketches HLL_8, ``args: {lg_k: 4..21}``, default 12: ~1.6% RSE).

    Stored as the sketch's updatable serialisation: the bytes Spark's ``hll_sketch_agg`` and
    ``hll_union_agg`` write, so both engines of the stream store the same bytes.
    """

    fn = "approx_count_distinct"
    acc_fields = ("hll",)
    args_allowed = ("lg_k",)

    def acc_types(self) -> list[pa.DataType]:
        return [pa.binary()]

    def value_type(self) -> pa.DataType:
        return pa.int64()

    def encode(self, acc: ds.hll_sketch) -> list[Any]:
        return [acc.serialize_updatable()]

    def decode(self, cells: list[Any]) -> ds.hll_sketch:
        return ds.hll_sketch.deserialize(cells[0]) if cells[0] is not None else self.create_accumulator()

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> list[tuple[str, str]]:
        problems = super().check_args(args)
        lg_k = args.get("lg_k", 12)
        if not isinstance(lg_k, int) or isinstance(lg_k, bool) or not 4 <= lg_k <= 21:
            problems.append(("args.lg_k", f"bad value {lg_k!r}; use a whole number from 4 to 21 (12 is ~1.6% error)"))
        return problems

    @property
    def lg_k(self) -> int:
        return int(self.arg("lg_k", 12))

    def create_accumulator(self) -> ds.hll_sketch:
        return ds.hll_sketch(self.lg_k, ds.tgt_hll_type.HLL_8)

    def accumulate(self, acc: ds.hll_sketch, *values: Any) -> ds.hll_sketch:
        if values[0] is not None:
            acc.update(values[0] if isinstance(values[0], (int, str)) else str(values[0]))
        return acc

    def merge(self, acc: ds.hll_sketch, other: ds.hll_sketch) -> ds.hll_sketch:
        union = ds.hll_union(self.lg_k)
        union.update(acc)
        union.update(other)
        return union.get_result(ds.tgt_hll_type.HLL_8)

    def get_value(self, acc: ds.hll_sketch) -> int:
        return round(acc.get_estimate())

    def merge_groups(self, columns: Sequence[pa.Array], offsets: np.ndarray) -> list[ds.hll_sketch]:
        """One union per group, fed every row's sketch in order: the same sketch as folding ``merge``
        (a union of two per step), without a union and a result per row. A group holding a sketch of
        another ``lg_k`` (the union downsamples it, and then the fold can differ) folds ``merge``."""
        blobs = _Blobs(columns[0])
        start, size = blobs.offsets[:-1], np.diff(blobs.offsets)
        sized = blobs.valid & (size >= 8)
        lg_k = np.zeros(len(size), dtype=np.int64)
        lg_k[sized] = np.frombuffer(blobs.view, dtype=np.uint8)[start[sized] + 3]  # the header's lg_k byte
        other_k = blobs.valid & ~(sized & (lg_k == self.lg_k))
        fold = np.add.reduceat(other_k, offsets[:-1]) > 0 if len(size) else np.zeros(len(offsets) - 1, dtype=bool)
        cells = blobs.array.to_numpy(zero_copy_only=False)  # bytes (or None) per row, no Python list of scalars
        deserialize, out = ds.hll_sketch.deserialize, []
        for lo, hi, by_merge in zip(offsets[:-1].tolist(), offsets[1:].tolist(), fold.tolist(), strict=True):
            if hi - lo == 1 or by_merge:
                out.append(self.merge_all([self.decode([cell]) for cell in cells[lo:hi]]))
                continue
            union = ds.hll_union(self.lg_k)
            for cell in cells[lo:hi]:
                if cell is not None:  # NULL is the empty sketch: a no-op in a union
                    union.update(deserialize(cell))
            out.append(union.get_result(ds.tgt_hll_type.HLL_8))
        return out

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        from pyspark.sql import functions as F

        assert value is not None
        if self.input_type not in ("int", "bigint"):
            # as UTF-8 bytes: the sketch hashes a string's UTF-8 bytes either way (the same sketch), but Spark
            # turns each string into a Java string and back first (0.3 s of a 2.2M-row mini-batch's pass)
            value = (value if self.input_type == "string" else value.cast("string")).cast("binary")
        return [F.hll_sketch_agg(value, self.lg_k)]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.hll_union_agg(accs[0])]

    def spark_value(self, accs: list[Column]) -> Column:
        from pyspark.sql import functions as F

        return F.hll_sketch_estimate(accs[0])


@builtin()
class ApproxPercentile(Builtin):
    """KLL quantile sketch (DataSketches KLL doubles); ``args: {q: 0..1, k: 8..65535}``.

    The result is a value from the input (cast back to the column's type); its rank is
    within the KLL normalised rank error of ``q`` (about 1.3% at the default ``k`` 200).
    """

    fn = "approx_percentile"
    acc_fields = ("kll",)
    numeric_only = True
    args_allowed = ("q", "k")

    def acc_types(self) -> list[pa.DataType]:
        return [pa.binary()]

    def encode(self, acc: ds.kll_doubles_sketch) -> list[Any]:
        return [acc.serialize()]

    def decode(self, cells: list[Any]) -> ds.kll_doubles_sketch:
        return ds.kll_doubles_sketch.deserialize(cells[0]) if cells[0] is not None else self.create_accumulator()

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> list[tuple[str, str]]:
        problems = super().check_args(args)
        q = args.get("q")
        if not isinstance(q, (int, float)) or isinstance(q, bool) or not 0.0 <= float(q) <= 1.0:
            problems.append(("args.q", f"bad quantile {q!r}; give args: {{q: 0.95}} with 0 <= q <= 1"))
        k = args.get("k", 200)
        if not isinstance(k, int) or isinstance(k, bool) or not 8 <= k <= 65535:
            problems.append(("args.k", f"bad value {k!r}; use a whole number from 8 to 65535 (default 200)"))
        return problems

    @property
    def q(self) -> float:
        return float(self.arg("q"))

    @property
    def k(self) -> int:
        return int(self.arg("k", 200))

    def create_accumulator(self) -> ds.kll_doubles_sketch:
        return ds.kll_doubles_sketch(self.k)

    def accumulate(self, acc: ds.kll_doubles_sketch, *values: Any) -> ds.kll_doubles_sketch:
        if values[0] is not None:
            acc.update(float(values[0]))
        return acc

    def accumulate_batch(self, acc: ds.kll_doubles_sketch, *arrays: pa.Array) -> ds.kll_doubles_sketch:
        values = np.array(arrays[0].drop_null().cast(pa.float64()), dtype=np.float64)  # writable copy
        if len(values):
            acc.update(values)
        return acc

    def merge(self, acc: ds.kll_doubles_sketch, other: ds.kll_doubles_sketch) -> ds.kll_doubles_sketch:
        acc.merge(other)
        return acc

    def merge_groups(self, columns: Sequence[pa.Array], offsets: np.ndarray) -> list[ds.kll_doubles_sketch]:
        """``merge_all`` per group, without deserialising the sketches that hold their items in level 0 only.

        DataSketches' merge of such a sketch is an ``update`` with each of its items in stored order
        (the same count, minimum, maximum and compactions), so their items are cut straight from the
        serialised bytes and fed to the group's accumulator by vectorised ``update``; the first row of a
        group, and any other sketch (compacted, or not in that layout), go through ``decode`` and ``merge``.
        """
        blobs = _Blobs(columns[0])
        header = _kll_level0_header(blobs)
        feed = header >= 0
        feed[offsets[:-1]] = False
        others = np.flatnonzero(~feed).tolist()  # the groups' first rows and the sketches merged as objects
        at = np.zeros(len(header) + 1, dtype=np.int64)  # fed rows i..j-1 hold items[at[i]:at[j]], in row order
        np.cumsum(np.where(feed, blobs.offsets[1:] - blobs.offsets[:-1] - header, 0) // 8, out=at[1:])
        items = _kll_items(blobs, np.where(feed, blobs.offsets[:-1] + header, 0), at)
        out = []
        k = 0
        for lo, hi in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
            acc = self.decode([blobs.cell(lo)])
            i = lo + 1
            while k < len(others) and others[k] <= lo:
                k += 1
            while True:
                j = others[k] if k < len(others) and others[k] < hi else hi
                if at[j] > at[i]:
                    acc.update(items[at[i]:at[j]])
                if j == hi:
                    break
                acc.merge(self.decode([blobs.cell(j)]))
                i, k = j + 1, k + 1
            out.append(acc)
        return out

    def get_value(self, acc: ds.kll_doubles_sketch) -> float | int | None:
        if acc.is_empty():
            return None
        value = acc.get_quantile(self.q, True)  # inclusive ranks, as Spark's kll_sketch_get_quantile_double
        return int(value) if self.input_type in ("int", "bigint") else value

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        from pyspark.sql import functions as F

        assert value is not None
        return [F.kll_sketch_agg_double(value.cast("double"), self.k)]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.kll_merge_agg_double(accs[0], self.k)]

    def spark_value(self, accs: list[Column]) -> Column:
        from pyspark.sql import functions as F

        empty = F.kll_sketch_get_n_double(accs[0]) == 0
        value = F.kll_sketch_get_quantile_double(accs[0], F.lit(self.q))
        return F.when(~empty, value.cast(self.input_type or "double"))


class _ByEventTime(Builtin):
    """``first``/``last`` non-NULL value by event time; ties broken by the smaller/larger value.

    The accumulator is the struct (event time, value): ordering structs makes both phases
    plain ``min``/``max``, associative and independent of how rows were split.
    """

    acc_fields = ("acc",)
    uses_event_time = True
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
        if other is None:
            return acc
        return self.accumulate(acc, other[1], other[0])

    def get_value(self, acc: tuple[Any, Any] | None) -> Any:
        return None if acc is None else acc[1]

    def merge_groups(self, columns: Sequence[pa.Array], offsets: np.ndarray) -> list[tuple[Any, Any] | None] | None:
        stored = self.merge_groups_stored(columns, offsets)
        return None if stored is None else [self.decode([cell]) for cell in stored[0].to_pylist()]

    def merge_groups_stored(self, columns: Sequence[pa.Array], offsets: np.ndarray) -> list[pa.Array] | None:
        """Column-wise, as stored: per group the earliest (latest) time, then the smallest (largest) value at it.

        The same order as the tuples' ``min``/``max``, for times as timestamps and values Arrow and
        Python order alike (integers, strings, binary, booleans, dates, times, timestamps); else None.
        """
        acc = columns[0]
        if isinstance(acc, pa.ChunkedArray):
            acc = acc.combine_chunks()
        if (not pa.types.is_struct(acc.type) or [f.name for f in acc.type] != ["at", "value"]
                or not (pa.types.is_timestamp(acc.type.field("at").type) and _orders_as_python(acc.type.field("at").type))
                or not _orders_as_python(acc.type.field("value").type)):
            return None
        groups = len(offsets) - 1
        if groups == 0:
            return [acc.slice(0, 0)]
        at, value = acc.flatten()
        valid = np.asarray(acc.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        at_valid = np.asarray(at.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if (valid & ~(at_valid & np.asarray(value.is_valid().to_numpy(zero_copy_only=False), dtype=bool))).any():
            return None  # a stored (time, NULL) or (NULL, value): leave it to the tuples
        earliest = type(self)._pick is min
        sentinel = np.iinfo(np.int64).max if earliest else np.iinfo(np.int64).min
        ticks = np.where(valid, at.cast(pa.int64()).fill_null(0).to_numpy(), sentinel)
        starts = offsets[:-1]
        best = (np.minimum if earliest else np.maximum).reduceat(ticks, starts)
        present = np.add.reduceat(valid.astype(np.int64), starts) > 0
        group = np.repeat(np.arange(groups, dtype=np.int64), np.diff(offsets))
        tied = valid & (ticks == best[group])
        how = "min" if earliest else "max"
        try:
            picked = (pa.table({"g": group[tied], "v": value.filter(pa.array(tied))})
                      .group_by("g", use_threads=False).aggregate([("v", how)]))
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None
        where = np.zeros(groups, dtype=np.int64)  # each present group's row of ``picked``
        where[picked.column("g").to_numpy()] = np.arange(picked.num_rows)
        missing = pa.array(~present)
        values = picked.column(f"v_{how}").combine_chunks().take(pa.array(where, mask=~present))
        times = pa.array(best, pa.int64(), mask=~present).cast(acc.type.field("at").type)
        return [pa.StructArray.from_arrays([times, values.cast(acc.type.field("value").type)], fields=list(acc.type),
                                           mask=missing)]

    def stored_values(self, columns: Sequence[pa.Array]) -> pa.Array:
        """``get_value`` of each stored accumulator, column-wise: its value (NULL where it is NULL)."""
        acc = columns[0].combine_chunks() if isinstance(columns[0], pa.ChunkedArray) else columns[0]
        return pc.if_else(acc.is_valid(), acc.field("value"), pa.scalar(None, acc.type.field("value").type))

    def _struct(self, value: Column, event_time: Column) -> Column:
        from pyspark.sql import functions as F

        return F.when(value.isNotNull() & event_time.isNotNull(),
                      F.struct(event_time.alias("at"), value.alias("value")))

    def spark_value(self, accs: list[Column]) -> Column:
        return accs[0].getField("value")


@builtin()
class First(_ByEventTime):
    fn = "first"
    _pick = min

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        from pyspark.sql import functions as F

        assert value is not None
        return [F.min(self._struct(value, event_time))]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.min(accs[0])]


@builtin()
class Last(_ByEventTime):
    fn = "last"
    _pick = max

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        from pyspark.sql import functions as F

        assert value is not None
        return [F.max(self._struct(value, event_time))]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        from pyspark.sql import functions as F

        return [F.max(accs[0])]


class _ExtremeMapView(Builtin):
    """``min``/``max`` over a CDC source, as Flink keeps them with a map view: the accumulator
    counts each value (a ``map<value, bigint>`` column), so retracting the current extreme
    falls back to the next one. Used instead of Min/Max when the spec sets ``source.op_column``."""

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
        acc = dict(acc)
        count = acc.get(value, 0) + n
        if count:
            acc[value] = count
        else:
            acc.pop(value, None)
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
        from pyspark.sql import functions as F

        present = F.map_keys(F.map_filter(accs[0], lambda _, n: n > 0))
        return F.array_min(present) if self._pick is min else F.array_max(present)

    def spark_partial_frame(self, rows: DataFrame, keys: list[str], sign: str, acc: str) -> DataFrame:
        """Per key, a map of value -> signed count (``sign`` is -1 on -U/-D rows)."""
        from pyspark.sql import functions as F

        column = self.columns[0]
        counts = (rows.where(F.col(column).isNotNull()).groupBy(*keys, F.col(column).alias("_v"))
                  .agg(F.sum(sign).cast("bigint").alias("_n")).where(F.col("_n") != 0))
        return counts.groupBy(*keys).agg(F.map_from_entries(F.collect_list(F.struct("_v", "_n"))).alias(acc))

    def spark_merge_frame(self, partials: DataFrame, keys: list[str], acc: str) -> DataFrame:
        from pyspark.sql import functions as F

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


class _Blobs:
    """A binary column's bytes: the values buffer, each row's offsets and validity, without a Python
    object per row."""

    def __init__(self, array: pa.Array) -> None:
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if not pa.types.is_binary(array.type):
            array = array.cast(pa.binary())
        n, base = len(array), array.offset
        validity, offsets, data = array.buffers()
        self.offsets = np.frombuffer(offsets, dtype=np.int32)[base:base + n + 1].astype(np.int64) if n else (
            np.zeros(1, dtype=np.int64))
        self.valid = (np.ones(n, dtype=bool) if validity is None or array.null_count == 0
                      else np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
        self.view = memoryview(data if data is not None else b"")
        self.array = array

    def cell(self, i: int) -> bytes | None:
        return bytes(self.view[self.offsets[i]:self.offsets[i + 1]]) if self.valid[i] else None


def _kll_items(blobs: _Blobs, begin: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The float64 items that start at byte ``begin[i]`` of ``blobs.view``, ``at[i + 1] - at[i]`` of them
    for row ``i``, concatenated in row order: gathered per byte alignment of ``begin`` by NumPy."""
    items = np.empty(int(at[-1]), dtype=np.float64)
    counts = np.diff(at)
    shift = begin % 8
    for s in range(8):
        rows = np.flatnonzero((shift == s) & (counts > 0))
        if not len(rows):
            continue
        n = counts[rows]
        rel = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)  # each item's place in its row
        aligned = np.frombuffer(blobs.view, dtype="<f8", count=(len(blobs.view) - s) // 8, offset=s)
        items[np.repeat(at[rows], n) + rel] = aligned[np.repeat((begin[rows] - s) // 8, n) + rel]
    return items


def _kll_level0_header(blobs: _Blobs) -> np.ndarray:
    """Per row, the bytes before its items when its KLL doubles sketch holds them in level 0 only, as
    DataSketches serialises it: the full layout with one level (preamble ints 5, serial version 1,
    family 15, m 8, ``n`` at byte 8, one level at byte 18, the items from byte 40) or one item
    (preamble 2, serial version 2, flag 4, the item at byte 8); 8 for an empty sketch and 0 for NULL
    (no items). -1 for any other row (compacted, or another layout).
    """
    start, stop = blobs.offsets[:-1], blobs.offsets[1:]
    size = stop - start
    header = np.full(len(size), -1, dtype=np.int64)
    header[~blobs.valid] = 0
    data = np.frombuffer(blobs.view, dtype=np.uint8)
    rows = np.flatnonzero(blobs.valid & (size >= 8))
    h = data[start[rows][:, None] + np.arange(8)]  # the 8 header bytes of each non-NULL row
    common = (h[:, 2] == 15) & (h[:, 6] == 8)
    short = common & (h[:, 0] == 2)
    empty = rows[short & (h[:, 1] == 1) & ((h[:, 3] & 1) == 1) & (size[rows] == 8)]
    single = rows[short & (h[:, 1] == 2) & (h[:, 3] == 4) & (size[rows] == 16)]
    full = rows[common & (h[:, 0] == 5) & (h[:, 1] == 1) & ((h[:, 3] & 5) == 0) & (size[rows] >= 40)]
    n = data[start[full][:, None] + np.arange(8, 16)].copy().view("<u8").ravel()
    full = full[(data[start[full] + 18] == 1) & (n < 2**31) & (size[full] == 40 + 8 * n.astype(np.int64))]
    header[empty], header[single], header[full] = 8, 8, 40
    return header


def _orders_as_python(type_: pa.DataType) -> bool:
    """Whether Arrow's min/max order values of this type as Python's comparisons order their Python
    values: not floats (NaN), nor nanosecond times or ``date64`` (their Python values are truncated)."""
    if pa.types.is_timestamp(type_) or pa.types.is_time(type_):
        return type_.unit != "ns"
    return (pa.types.is_integer(type_) or pa.types.is_string(type_) or pa.types.is_large_string(type_)
            or pa.types.is_binary(type_) or pa.types.is_large_binary(type_) or pa.types.is_boolean(type_)
            or pa.types.is_date32(type_))
