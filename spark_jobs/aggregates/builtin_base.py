"""The base class of the built-in aggregates, and their registry: each built-in's own module subclasses ``Builtin``
and registers with ``@builtin``; :mod:`spark_jobs.aggregates.builtins` imports them all, registering every one."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import pyarrow as pa

from spark_jobs.aggregates.contract import AggregateFunction
from spark_jobs.spark_functions import F

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
else:  # a DAG file's parse imports the aggregates, never pyspark
    Column = DataFrame = Any  # annotations only

__all__ = ["ARROW_TYPES", "BUILTINS", "NUMERIC", "RETRACTING", "Builtin", "Column", "DataFrame", "F", "builtin"]

NUMERIC = ("int", "bigint", "float", "double")
ARROW_TYPES: dict[str, pa.DataType] = {  # Spark SQL type of a source column -> the Arrow type its values are stored as
    "string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "float": pa.float32(), "double": pa.float64(),
    "boolean": pa.bool_(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC")}


class Builtin(AggregateFunction[Any, Any]):
    """A built-in aggregate bound to its output name, input columns, args and input column type."""

    fn: ClassVar[str]
    column_required: ClassVar[bool] = True
    numeric_only: ClassVar[bool] = False
    args_allowed: ClassVar[tuple[str, ...]] = ()
    map_view: ClassVar[bool] = False  # its partial phase is a keyed aggregation (spark_partial_frame), not expressions

    def __init__(self, name: str, columns: Sequence[str] = (), args: Mapping[str, Any] | None = None,
                 input_type: str | None = None) -> None:
        self.name, self.columns, self.args, self.input_type = name, tuple(columns), dict(args or {}), input_type

    # stored types: Spark's phases produce these (tests/integration/test_stored_types.py holds them to it)
    @property
    def input_arrow(self) -> pa.DataType:
        """The Arrow type of the input column (double when there is none)."""
        return ARROW_TYPES.get(self.input_type or "double", pa.float64())

    def acc_types(self) -> list[pa.DataType]:
        return [self.value_type() if self.accumulator_type is None else self.accumulator_type]

    def value_type(self) -> pa.DataType:
        return self.input_arrow if self.result_type is None else self.result_type

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> list[tuple[str, str]]:
        """Problems with ``args`` as (field, message); subclasses add range checks."""
        return [("args", f"unknown argument {k!r} for {cls.fn}; allowed: {', '.join(cls.args_allowed) or 'none'}")
                for k in args if k not in cls.args_allowed]

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        """Accumulator expressions over raw rows; ``sign`` (-1 for -U/-D rows) only for retracting ones."""
        raise NotImplementedError

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        raise NotImplementedError

    def spark_value(self, accs: list[Column]) -> Column:
        return accs[0]

    def spark_partial_frame(self, rows: DataFrame, keys: list[str], sign: str, acc: str) -> DataFrame:
        """The keyed partial phase of ``map_view`` aggregates: a count per key and value, an aggregation of its own."""
        raise NotImplementedError


B = TypeVar("B", bound=type[Builtin])
BUILTINS: dict[str, type[Builtin]] = {}
RETRACTING: dict[str, type[Builtin]] = {}  # what ``fn`` resolves to for a changelog source: the retracting forms


def builtin(*, changelog_form: bool = False) -> Callable[[B], B]:
    """Register a built-in under its ``fn``; a ``changelog_form`` replaces, for a changelog source, a plain one."""

    def register(cls: B) -> B:
        if changelog_form:
            RETRACTING[cls.fn] = cls
            return cls
        BUILTINS[cls.fn] = cls
        if cls.retract is not AggregateFunction.retract:
            RETRACTING.setdefault(cls.fn, cls)
        return cls

    return register
