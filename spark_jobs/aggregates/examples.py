"""A user-defined aggregate shipped as an example: the weighted mean of a column. Use it in a spec as
``fn: "spark_jobs.aggregates.examples:WeightedAvg"`` with ``columns: [value, weight]``. It shows the contract a user
aggregate follows: an accumulator stored as a struct of numbers, a vectorised ``accumulate_batch``, and the optional
column-wise ``merge_groups_stored`` that merges (rollups, ``apply``) use over many groups at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.aggregates.contract import AggregateFunction

__all__ = ["VectorSum", "WeightedAvg"]

Acc = dict[str, Any]


class WeightedAvg(AggregateFunction[Acc, "float | None"]):
    """sum(value * weight) / sum(weight) over rows where both are non-NULL."""

    accumulator_type = pa.struct([("weighted_sum", pa.float64()), ("weight", pa.float64())])
    result_type = pa.float64()
    num_inputs = 2

    def create_accumulator(self) -> Acc:
        return {"weighted_sum": 0.0, "weight": 0.0}

    def accumulate(self, acc: Acc, *values: Any) -> Acc:
        value, weight = values
        if value is not None and weight is not None:
            acc["weighted_sum"] += float(value) * float(weight)
            acc["weight"] += float(weight)
        return acc

    def retract(self, acc: Acc, *values: Any) -> Acc:
        """A row taken back is the row accumulated with its weight negated (exact in floating point)."""
        value, weight = values
        return self.accumulate(acc, value, None if weight is None else -float(weight))

    def accumulate_batch(self, acc: Acc, *arrays: pa.Array) -> Acc:
        values, weights = (a.cast(pa.float64()) for a in arrays)
        both = pc.and_(pc.is_valid(values), pc.is_valid(weights))
        acc["weighted_sum"] += pc.sum(pc.multiply(values, weights).filter(both)).as_py() or 0.0
        acc["weight"] += pc.sum(weights.filter(both)).as_py() or 0.0
        return acc

    def merge(self, acc: Acc, other: Acc) -> Acc:
        return {k: acc[k] + other[k] for k in acc}

    def merge_batch(self, acc: Acc, others: list[Acc]) -> Acc:
        return {k: acc[k] + sum(o[k] for o in others) for k in acc}

    def merge_groups_stored(self, columns: Sequence[pa.Array], offsets: np.ndarray) -> list[pa.Array] | None:
        """Optional and vectorised: each group's sums, as stored (a merge of many partials is two sums)."""
        acc = columns[0].combine_chunks() if isinstance(columns[0], pa.ChunkedArray) else columns[0]
        if len(offsets) == 1:
            return [acc.slice(0, 0)]
        fields = [np.add.reduceat(pc.fill_null(pc.if_else(acc.is_valid(), acc.field(name), 0.0), 0.0).to_numpy(),
                                  offsets[:-1]) for name in ("weighted_sum", "weight")]
        return [pa.StructArray.from_arrays([pa.array(f, pa.float64()) for f in fields], fields=list(acc.type))]

    def get_value(self, acc: Acc) -> float | None:
        return acc["weighted_sum"] / acc["weight"] if acc["weight"] else None


class VectorSum(AggregateFunction[Acc, "int | None"]):
    """A user-defined twin of the built-in ``sum`` over integers, to measure the UDAF path."""

    accumulator_type = pa.struct([("sum", pa.int64()), ("count", pa.int64())])
    result_type = pa.int64()
    num_inputs = 1

    def create_accumulator(self) -> Acc:
        return {"sum": 0, "count": 0}

    def accumulate(self, acc: Acc, *values: Any) -> Acc:
        if values[0] is not None:
            acc["sum"] += values[0]
            acc["count"] += 1
        return acc

    def accumulate_batch(self, acc: Acc, *arrays: pa.Array) -> Acc:
        acc["sum"] += pc.sum(arrays[0]).as_py() or 0
        acc["count"] += len(arrays[0]) - arrays[0].null_count
        return acc

    def merge(self, acc: Acc, other: Acc) -> Acc:
        return {"sum": acc["sum"] + other["sum"], "count": acc["count"] + other["count"]}

    def merge_batch(self, acc: Acc, others: list[Acc]) -> Acc:
        return {k: acc[k] + sum(o[k] for o in others) for k in acc}

    def get_value(self, acc: Acc) -> int | None:
        return acc["sum"] if acc["count"] else None
