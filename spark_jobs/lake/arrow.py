"""Arrow helpers for rows the driver holds: file layout, reading data files."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark_jobs.lake._types import DataFile
from spark_jobs.lake.storage import local_path

__all__ = ["fill_columns", "read_data_files", "split_by", "split_rows"]


def fill_columns(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns, in its order: NULL for each it lacks (added since, or kept for history)."""
    for f in schema:
        if f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table.select(schema.names)


def split_by(table: pa.Table, column: str, files: int) -> list[pa.Table]:
    """Up to ``files`` tables holding contiguous ranges of ``column``'s values; each value in one."""
    if table.num_rows == 0 or files <= 1:
        return [table]
    values = pc.unique(table.column(column)).sort()
    bounds = [values[int(i * len(values) / files)] for i in range(1, min(files, len(values)))]
    piece = np.zeros(table.num_rows, dtype=np.int64)  # the range of each row (NULL in the first)
    for bound in bounds:
        piece += pc.fill_null(pc.greater_equal(table.column(column), bound), False).to_numpy(zero_copy_only=False)
    return split_rows(table, piece, len(bounds) + 1)


def split_rows(table: pa.Table, piece: np.ndarray, pieces: int) -> list[pa.Table]:
    """``table``'s rows in ``pieces`` tables by each row's piece number, in stored order within each: one
    ``take`` of the table (a filter per piece would read it once per piece). Empty pieces are left out."""
    order = np.argsort(piece, kind="stable")
    counts = np.bincount(piece, minlength=pieces)
    taken = table.take(pa.array(order))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return [taken.slice(int(lo), int(n)) for lo, n in zip(starts, counts, strict=True) if n]


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
