"""Matching rows by key columns, NULL matching NULL: a NULL group key is a group of its own, as in SQL's GROUP BY
(Flink, Spark and DuckDB group it so), so every join on group keys must match it. Spark's form for DataFrames, Arrow's
for the rows the driver holds."""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from operator import and_
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.spark_functions import F

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["arrow_join", "join_on_keys", "key_mask"]

_FLAG = "__null_"


def join_on_keys(left: DataFrame, right: DataFrame, keys: Sequence[str], how: str = "inner") -> DataFrame:
    """``left.join(right, keys, how)`` with NULL matching NULL (``<=>``, which Spark still plans as an equi-join);
    the outer joins' key columns are coalesced from both sides, as a join on names gives them."""
    if not keys:
        return left.join(right, F.lit(True), how)
    renamed = {k: f"_right_{k}" for k in keys}  # both sides often come from the same rows: names, not lineage
    right = right.withColumnsRenamed(renamed)
    joined = left.join(right, reduce(and_, (F.col(k).eqNullSafe(F.col(r)) for k, r in renamed.items())), how)
    if how in ("right", "right_outer", "full", "full_outer", "outer"):
        joined = joined.withColumns({k: F.coalesce(F.col(k), F.col(r)) for k, r in renamed.items()})
    return joined.drop(*renamed.values())


def arrow_join(left: pa.Table, right: pa.Table, keys: Sequence[str], join_type: str, **options: Any) -> pa.Table:
    """``left.join(right, keys, join_type)`` with NULL matching NULL: Arrow's hash join never matches NULL, so each
    key joins as (value or a fill, is NULL) and gets its NULLs back after."""
    keys = list(keys)
    flags = [_FLAG + k for k in keys]
    out = _flagged(left, keys).join(_flagged(right, keys), [*keys, *flags], join_type=join_type, use_threads=False,
                                    **options)
    for k, flag in zip(keys, flags, strict=True):
        if k in out.column_names and flag in out.column_names:
            column = out.column(k)
            out = out.set_column(out.column_names.index(k), k,
                                 pc.if_else(out.column(flag), pa.nulls(out.num_rows, column.type), column))
    return out.drop_columns([f for f in flags if f in out.column_names])


def _flagged(table: pa.Table, keys: list[str]) -> pa.Table:
    for k in keys:
        column = table.column(k)
        filled = pc.fill_null(column, pa.array([0]).cast(column.type)[0]) if column.null_count else column
        table = table.set_column(table.column_names.index(k), k, filled).append_column(_FLAG + k, pc.is_null(column))
    return table


def key_mask(table: pa.Table, keys: Sequence[str], probe: pa.Table) -> np.ndarray:
    """Which rows of ``table`` have a key (the ``keys`` columns) that occurs in ``probe``: a hash join on the key
    columns and a row number, as Arrow joins carry no list or map payload columns (accumulators often are both)."""
    keys = list(keys)
    mask = np.zeros(table.num_rows, dtype=bool)
    if not keys or table.num_rows == 0 or probe.num_rows == 0:
        mask[:] = not keys and probe.num_rows > 0  # no keys: one global key, which a probe with rows holds
        return mask
    rows = table.select(keys).append_column("__row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    hit = arrow_join(rows, probe.select(keys), keys, "left semi").column("__row")
    mask[hit.to_numpy()] = True
    return mask

