"""Matching rows of Arrow tables by key columns, for rows the driver holds."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["key_mask"]


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
