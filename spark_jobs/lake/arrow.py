"""Arrow helpers for rows the driver holds: their layout in files, reading data files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark_jobs.key_match import run_starts
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
    """The rows of each file to write, with its partition values: by ``cluster`` (ranges of its column, the rows at or
    past ``tail_from`` in a file of their own), then by partition, each sorted by ``sort_by`` (stable: else in stored
    order). One sort and one ``take`` of the table for every file: a ``take`` per step cost a commit of a million
    session rows 2 s, most of it re-reading a collected table's many chunks."""
    if table.num_rows == 0:
        return []
    order_by = {"__file": _cluster_pieces(table, cluster), **{c: table.column(c) for c in [*partition_by, *sort_by]}}
    if len(order_by) == 1 and cluster is None:
        return [({}, table)]
    keys = pa.table(order_by)
    order = pc.sort_indices(keys, [(c, "ascending") for c in order_by])
    table, keys = table.combine_chunks().take(order), keys.select(["__file", *partition_by]).take(order)
    starts = np.flatnonzero(run_starts(keys))
    ends = [*starts[1:].tolist(), table.num_rows]
    values = keys.select(list(partition_by)).take(pa.array(starts)).to_pylist() if partition_by else [{}] * len(starts)
    return [(v, table.slice(lo, hi - lo)) for v, lo, hi in zip(values, starts.tolist(), ends, strict=True)]


def _cluster_pieces(table: pa.Table, cluster: Cluster | None) -> np.ndarray:
    """Each row's file by ``cluster``: up to ``files`` contiguous ranges of its column's values (NULL in the first),
    each value in one; the tail after them."""
    piece = np.zeros(table.num_rows, dtype=np.int64)
    if cluster is None:
        return piece
    column = table.column(cluster.column)
    tail = (pc.fill_null(pc.greater_equal(column, cluster.tail_from), False).to_numpy(zero_copy_only=False)
            if cluster.tail_from is not None else np.zeros(table.num_rows, dtype=bool))
    values = pc.unique(column.filter(pa.array(~tail))).drop_null().sort()
    for i in range(1, min(cluster.files, len(values))):
        piece += pc.fill_null(pc.greater_equal(column, values[int(i * len(values) / cluster.files)]),
                              False).to_numpy(zero_copy_only=False)
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
