"""The accumulator contract every aggregate implements, after Flink's ``AggregateFunction``: rows fold into an
*accumulator* with ``accumulate`` (combine), accumulators of different batches with ``merge`` (reduce), and
``get_value`` makes the result, so each batch is pre-aggregated once and a backfill re-merges only what it touched.
Every method returns the new accumulator (it may mutate its argument), so immutable ones such as numbers work too. An
aggregate also owns how its accumulator is stored (``acc_fields``, ``encode``/``decode``): the driver's merge and
Spark's phases read and write the same columns, so either continues the other."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import pyarrow as pa

from spark_jobs.errors import MergeNotSupportedError, RetractNotSupportedError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ACC", "OUT", "AggregateFunction", "BoundAggregate"]

ACC = TypeVar("ACC")
OUT = TypeVar("OUT")


class AggregateFunction(ABC, Generic[ACC, OUT]):
    """Base class for built-in and user-defined aggregates. A user-defined one (spec ``fn: "package.module:Class"``)
    sets ``accumulator_type`` (the Arrow type its accumulator is stored as; a struct of numbers stays portable, and the
    accumulator handed around is its Python value, a ``dict`` for a struct), ``result_type`` (of ``get_value``) and
    ``num_inputs`` (the spec's ``columns``), and should override ``accumulate_batch`` with a vectorised version: the
    engine calls it once per group and Arrow batch, never once per row."""

    accumulator_type: ClassVar[pa.DataType | None] = None
    result_type: ClassVar[pa.DataType | None] = None
    num_inputs: ClassVar[int | None] = None
    acc_fields: ClassVar[tuple[str, ...]] = ("acc",)  # stored as columns ``<name>__<field>``
    # The Arrow hash aggregation ("sum", "min", "max") that merges each stored field, when a column-wise
    # fold equals ``merge``; None merges through ``decode``/``merge_all``/``encode`` per group instead.
    arrow_merge: ClassVar[tuple[str, ...] | None] = None

    @abstractmethod
    def create_accumulator(self) -> ACC:
        """A fresh, empty accumulator: ``get_value`` of it is the aggregate of no rows."""

    @abstractmethod
    def accumulate(self, acc: ACC, *values: Any) -> ACC:
        """Fold one input row (its column values, ``None`` for SQL NULL) into ``acc``."""

    def retract(self, acc: ACC, *values: Any) -> ACC:
        """Undo ``accumulate`` of the same values; needed for -U/-D input rows."""
        raise RetractNotSupportedError(f"{type(self).__name__} cannot retract; "
                                       "it cannot consume -U/-D (retraction) input")

    def merge(self, acc: ACC, other: ACC) -> ACC:
        """Fold another accumulator into ``acc``: associative, commutative, and with
        ``merge(create_accumulator(), x) == x`` (the engine skips merges of a single partial)."""
        raise MergeNotSupportedError(f"{type(self).__name__} has no merge; "
                                     "it cannot run as a two-phase (combine/reduce) aggregate")

    @abstractmethod
    def get_value(self, acc: ACC) -> OUT:
        """The result for an accumulator."""

    def accumulate_batch(self, acc: ACC, *arrays: pa.Array) -> ACC:
        """Fold all rows of one group in an Arrow batch. Override with a vectorised version."""
        for row in zip(*(a.to_pylist() for a in arrays), strict=True):
            acc = self.accumulate(acc, *row)
        return acc

    def retract_batch(self, acc: ACC, *arrays: pa.Array) -> ACC:
        """Undo all rows of one group in an Arrow batch (a changelog's -U/-D rows)."""
        for row in zip(*(a.to_pylist() for a in arrays), strict=True):
            acc = self.retract(acc, *row)
        return acc

    def merge_batch(self, acc: ACC, others: list[ACC]) -> ACC:
        """Fold several accumulators of one group; override when a vectorised merge exists."""
        for other in others:
            acc = self.merge(acc, other)
        return acc

    def merge_all(self, accs: list[ACC]) -> ACC:
        """Merge one group's accumulators (at least one), as both engines do: a single one is kept
        as it is (the identity law), several are folded by ``merge_batch``."""
        return accs[0] if len(accs) == 1 else self.merge_batch(accs[0], accs[1:])

    def merge_groups(self, columns: Sequence[pa.Array], offsets: np.ndarray) -> list[ACC] | None:
        """Optional: each group's accumulator (``merge_all`` of its rows' ``decode``), column-wise. ``columns``: the
        stored ``acc_fields`` columns, group ``g`` in rows ``offsets[g]:offsets[g + 1]`` (at least one). None (the
        default, or inputs an override does not handle): the caller merges row by row."""
        return None

    def merge_groups_stored(self, columns: Sequence[pa.Array], offsets: np.ndarray) -> list[pa.Array] | None:
        """Optional, before ``merge_groups``: the merged accumulators as their stored columns (one array per
        ``acc_fields`` column, a row per group), never made Python objects; see ``stored_values``."""
        return None

    def stored_values(self, columns: Sequence[pa.Array]) -> pa.Array | None:
        """Optional: ``get_value`` of each stored accumulator, column-wise (None: decoded row by row)."""
        return None

    def encode(self, acc: ACC) -> list[Any]:
        """The accumulator as the values of its ``acc_fields`` columns (Python values of Arrow types)."""
        return [acc]

    def decode(self, cells: list[Any]) -> ACC:
        """A fresh accumulator from stored column values (merges may mutate it); NULL is empty."""
        return cells[0] if cells[0] is not None else self.create_accumulator()

    def acc_types(self) -> list[pa.DataType]:
        """The Arrow types of its ``acc_fields`` columns as stored: what a schema change adds for a new aggregate
        without Spark. Spark's phases must produce them (a test holds the built-ins to it)."""
        assert self.accumulator_type is not None, f"{type(self).__name__} sets no accumulator_type"
        return [self.accumulator_type]

    def value_type(self) -> pa.DataType:
        """The Arrow type of ``get_value``, as the ``aggregates`` table stores it."""
        assert self.result_type is not None, f"{type(self).__name__} sets no result_type"
        return self.result_type

    @property
    def supports_retract(self) -> bool:
        return type(self).retract is not AggregateFunction.retract


@dataclass(frozen=True)
class BoundAggregate:
    """An aggregate bound to a spec entry: its output name, input columns and stored columns."""

    name: str
    columns: tuple[str, ...]
    function: AggregateFunction[Any, Any]

    @property
    def acc_columns(self) -> list[str]:
        return [f"{self.name}__{f}" for f in self.function.acc_fields]
