"""Arrow helpers for rows the driver holds: their layout in files, reading data files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark_jobs.lake._types import Cluster, DataFile
from spark_jobs.lake.storage import local_path

__all__ = ["file_layout", "fill_columns", "read_data_files"]


def fill_columns(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns, in its order: NULL for each it lacks (added since, or kept for history)."""
    for f in schema:
        if f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table.select(schema.names)


def file_layout(table: pa.Table, cluster: Cluster | None, partition_by: Sequence[str],
                sort_by: Sequence[str]) -> list[tuple[dict[str, Any], pa.Table]]:
    """The rows of each file to write, and its partition values: by ``cluster`` (ranges of its column; rows at or past
    ``tail_from`` in a file of their own), then partition, each sorted by ``sort_by`` (stable). One sort, then one
    ``take`` for every file (one per step cost a million session rows 2 s), or slices of rows in a few sorted runs."""
    if not table.num_rows or not (cluster or partition_by or sort_by):  # a file per core (of 256k rows at least)
        step = max(1, -(-table.num_rows // max(1, min(os.cpu_count() or 1, table.num_rows // 262_144))))
        return [({}, table.slice(lo, step)) for lo in range(0, table.num_rows, step)]
    order_by = {"__file": _cluster_pieces(table, cluster), **{c: table.column(c) for c in [*partition_by, *sort_by]}}
    keys = pa.table(order_by)
    order = pc.sort_indices(keys, [(c, "ascending") for c in order_by])
    edges = np.flatnonzero(np.diff(picks := order.to_numpy()) != 1) + 1  # rows merged in about their written order
    table = (pa.concat_tables([table.slice(int(run[0]), len(run)) for run in np.split(picks, edges)])  # a few runs:
             if len(edges) <= len(picks) // 1024 else table.combine_chunks().take(order))  # slices, no copy
    keys = keys.select(["__file", *partition_by]).take(order)
    files = keys.group_by(list(keys.column_names), use_threads=False).aggregate([([], "count_all")])  # in order
    at = [0, *np.cumsum(files.column("count_all").to_numpy()).tolist()]
    values = files.select(list(partition_by)).to_pylist() if partition_by else [{}] * files.num_rows
    return [(v, table.slice(lo, hi - lo)) for v, lo, hi in zip(values, at, at[1:], strict=False)]


def _cluster_pieces(table: pa.Table, cluster: Cluster | None) -> np.ndarray:
    """Each row's file by ``cluster``: up to ``files`` contiguous ranges of its column's values (NULL in the first),
    each value in one; the tail after them."""
    if cluster is None:
        return np.zeros(table.num_rows, dtype=np.int64)
    column = table.column(cluster.column)

    def at_least(bound: Any) -> np.ndarray:
        return np.asarray(pc.fill_null(pc.greater_equal(column, bound), False).to_numpy(zero_copy_only=False))
    tail = at_least(cluster.tail_from) if cluster.tail_from is not None else np.zeros(table.num_rows, dtype=bool)
    values = pc.unique(column.filter(pa.array(~tail))).drop_null().sort()
    piece = sum((at_least(values[int(i * len(values) / cluster.files)]).astype(np.int64)
                 for i in range(1, min(cluster.files, len(values)))), np.zeros(table.num_rows, dtype=np.int64))
    piece[tail] = cluster.files
    return piece


def read_data_files(root: str, files: Sequence[DataFile], schema: pa.Schema) -> pa.Table:
    """The rows of some data files of a local Delta table without delta-rs (a forked worker cannot use it):
    each Parquet file with its partition values as columns, as ``schema``. Only for a table whose protocol
    needs no reader feature (no deletion vectors or column mapping); a column the file lacks reads NULL."""
    tables = []
    for f in files:
        table = pq.read_table(os.path.join(local_path(root), f.path))
        for name, value in f.partition_values.items():
            kind = schema.field(name).type
            scalar = pa.scalar(None, kind) if value is None else pa.scalar(value).cast(kind)
            table = table.append_column(pa.field(name, kind), pa.repeat(scalar, table.num_rows))
        tables.append(fill_columns(table, schema).cast(schema))
    return pa.concat_tables(tables) if tables else schema.empty_table()
