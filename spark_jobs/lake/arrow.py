"""Arrow helpers for rows the driver holds: key matching and file layout."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["key_mask", "split_by"]


def key_mask(table: pa.Table, keys: Sequence[str], probe: pa.Table) -> np.ndarray:
    """Which rows of ``table`` have a key (the ``keys`` columns) that occurs in ``probe``.

    A hash join on the key columns and a row number: Arrow joins carry no list or map
    payload columns, and accumulator columns are often both.
    """
    keys = list(keys)
    mask = np.zeros(table.num_rows, dtype=bool)
    if table.num_rows == 0 or probe.num_rows == 0:
        return mask
    if not keys:  # one global key
        mask[:] = True
        return mask
    rows = table.select(keys).append_column("__row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    hit = rows.join(probe.select(keys), keys, join_type="left semi", use_threads=False).column("__row")
    mask[hit.to_numpy()] = True
    return mask


def split_by(table: pa.Table, column: str, files: int) -> list[pa.Table]:
    """Up to ``files`` tables holding contiguous ranges of ``column``'s values; each value in one."""
    if table.num_rows == 0 or files <= 1:
        return [table]
    values = pc.unique(table.column(column)).sort()
    bounds = [values[int(i * len(values) / files)] for i in range(1, min(files, len(values)))]
    out, rest = [], table
    for bound in bounds:
        below = pc.fill_null(pc.less(rest.column(column), bound), True)
        out.append(rest.filter(below))
        rest = rest.filter(pc.invert(below))
    out.append(rest)
    return [t for t in out if t.num_rows]
