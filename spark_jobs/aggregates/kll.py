"""``approx_percentile``: a DataSketches KLL doubles sketch, stored as its serialisation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import datasketches as ds
import numpy as np
import pyarrow as pa

from spark_jobs.aggregates.builtin_base import Builtin, Column, F, builtin
from spark_jobs.aggregates.sketch_bytes import Blobs, kll_items, kll_level0_header

__all__ = ["ApproxPercentile"]


@builtin()
class ApproxPercentile(Builtin):
    """KLL doubles, ``args: {q: 0..1, k: 8..65535}``. The result is a value from the input (cast back to the
    column's type) whose rank is within the normalised rank error of ``q`` (about 1.3% at the default ``k`` 200)."""

    fn = "approx_percentile"
    acc_fields = ("kll",)
    numeric_only = True
    args_allowed = ("q", "k")
    accumulator_type = pa.binary()

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
        return float(self.args["q"])

    @property
    def k(self) -> int:
        return int(self.args.get("k", 200))

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
        """``merge_all`` per group, without deserialising the sketches that hold their items in level 0 only: merging
        one is an ``update`` with each of its items in stored order (the same count, minimum, maximum and compactions),
        so their items are cut from the bytes and fed to a vectorised ``update``; a group's first row and any other
        sketch go through ``decode`` and ``merge``."""
        blobs = Blobs(columns[0])
        header = kll_level0_header(blobs)
        feed = header >= 0
        feed[offsets[:-1]] = False
        others = np.flatnonzero(~feed).tolist()  # the groups' first rows and the sketches merged as objects
        items, at = kll_items(blobs, header, feed)  # fed rows i..j-1 hold items[at[i]:at[j]], in row order
        out, k = [], 0
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

    def stored_values(self, columns: Sequence[pa.Array]) -> pa.Array:
        """``get_value`` of each stored sketch. One that never compacted (a short window's or session's) holds its
        ``n`` items in level 0, where the inclusive ``q`` quantile is the ``ceil(q * n)``-th smallest (the item
        DataSketches' sorted view picks): those are cut from the bytes and ranked per row at once; the rest decoded."""
        blobs = Blobs(columns[0])
        header = kll_level0_header(blobs)
        items, at = kll_items(blobs, header, header >= 0)
        n = np.diff(at)
        found = n > 0
        values = _ranked(items, at, np.maximum(np.ceil(self.q * n).astype(np.int64), 1) - 1)
        for i in np.flatnonzero((header < 0) & blobs.valid).tolist():  # compacted (or not a level-0 sketch)
            value = self.get_value(self.decode([blobs.cell(i)]))
            found[i], values[i] = value is not None, value if value is not None else 0.0
        integral = pa.types.is_integer(self.value_type())  # as ``int()`` of the item
        return pa.array(np.trunc(values) if integral else values, mask=~found).cast(self.value_type())

    def spark_partial(self, value: Column | None, event_time: Column, sign: Column | None = None) -> list[Column]:
        assert value is not None
        return [F.kll_sketch_agg_double(value.cast("double"), self.k)]

    def spark_merge(self, accs: list[Column]) -> list[Column]:
        return [F.kll_merge_agg_double(accs[0], self.k)]

    def spark_value(self, accs: list[Column]) -> Column:
        empty = F.kll_sketch_get_n_double(accs[0]) == 0
        value = F.kll_sketch_get_quantile_double(accs[0], F.lit(self.q))
        return F.when(~empty, value.cast(self.input_type or "double"))


def _ranked(items: np.ndarray, at: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Per row, its items' ``rank``-th smallest (0 for a row without items). The rows of each item count up to 16,
    and of each power of two above (padded with +inf), are sorted as one 2-D array: ten times a ``lexsort`` of them."""
    n, out = np.diff(at), np.zeros(len(at) - 1)
    width = np.where(n > 16, 1 << np.ceil(np.log2(np.maximum(n, 1))).astype(np.int64), n)
    for w in np.unique(width[width > 0]).tolist():
        rows = np.flatnonzero(width == w)
        index = at[rows][:, None] + np.arange(w)
        block = np.where(index < at[rows + 1][:, None], items[np.minimum(index, len(items) - 1)], np.inf)
        out[rows] = np.sort(block, axis=1)[np.arange(len(rows)), rank[rows]]
    return out
