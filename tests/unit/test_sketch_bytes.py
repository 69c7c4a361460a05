"""``sketch_bytes`` reads DataSketches' serialised sketches as the ``datasketches`` library deserialises them.

Columns of random sketches (empty, one item, a few items in level 0, compacted; several ``k`` and ``lg_k``,
both HLL serialisations), with NULLs, another sketch's bytes and sliced or chunked arrays.
"""

from __future__ import annotations

import datasketches as ds
import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.aggregates.hll import ApproxCountDistinct
from spark_jobs.aggregates.kll import ApproxPercentile
from spark_jobs.aggregates.sketch_bytes import Blobs, hll_coupons, hll_lg_k, kll_items, kll_level0_header

SETTINGS = settings(max_examples=60, deadline=None, database=None)
HLL_TYPES = [ds.tgt_hll_type.HLL_4, ds.tgt_hll_type.HLL_6, ds.tgt_hll_type.HLL_8]


@st.composite
def kll_cells(draw: st.DrawFn) -> bytes:
    """A KLL doubles sketch's bytes: updated one by one or by array, or merged, maybe queried (level 0 sorted)."""
    k = draw(st.sampled_from([8, 9, 20, 200]))
    n = draw(st.sampled_from([0, 1, 2, k - 1, k, k + 1, 3 * k]) | st.integers(0, 3 * k))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = rng.normal(size=n) if draw(st.booleans()) else rng.integers(-3, 3, size=n).astype(np.float64)  # ties
    sketch = ds.kll_doubles_sketch(k)
    how = draw(st.sampled_from(["one by one", "array", "merged"]))
    if how == "one by one":
        for v in values.tolist():
            sketch.update(v)
    elif how == "array" and n:
        sketch.update(values.copy())
    elif how == "merged":
        for part in np.array_split(values, draw(st.integers(1, 4))):
            other = ds.kll_doubles_sketch(k)
            if len(part):
                other.update(part.copy())
            sketch.merge(other)
    if draw(st.booleans()) and n:
        sketch.get_quantile(0.5, True)  # sorts level 0 in place and flags it so
    return sketch.serialize()


@st.composite
def hll_cells(draw: st.DrawFn) -> bytes:
    """An HLL sketch's bytes, in list, set or HLL mode, updatable or compact serialisation."""
    sketch = ds.hll_sketch(draw(st.integers(4, 21)), draw(st.sampled_from(HLL_TYPES)))
    start = draw(st.integers(0, 2**40))
    for v in range(start, start + draw(st.sampled_from([0, 1, 7, 300, 5000]) | st.integers(0, 2000))):
        sketch.update(v)
    return sketch.serialize_updatable() if draw(st.booleans()) else sketch.serialize_compact()


@st.composite
def columns(draw: st.DrawFn, sketches: st.SearchStrategy[bytes],
            others: st.SearchStrategy[bytes]) -> tuple[pa.Array, list[tuple[str, bytes | None]]]:
    """A binary column of ``sketches`` with NULLs and ``others`` among them, maybe sliced or chunked; and
    each row as (what it is, its bytes)."""
    rows = draw(st.lists(st.tuples(st.just("sketch"), sketches) | st.just(("null", None))
                         | st.tuples(st.just("other"), others), max_size=12))
    cells = [cell for _, cell in rows]
    skip = draw(st.integers(0, 2))
    array: pa.Array = pa.array([b"\x05" * 8] * skip + cells, pa.binary()).slice(skip)  # a non-zero offset
    if draw(st.booleans()) and cells:
        cut = draw(st.integers(0, len(cells)))
        return pa.chunked_array([array.slice(0, cut), array.slice(cut)], pa.binary()), rows
    return array, rows


@SETTINGS
@given(columns(hll_cells(), kll_cells()))
def test_hll_lg_k_is_the_one_the_sketch_deserialises_with(column):
    array, rows = column
    lg_k = hll_lg_k(Blobs(array))
    assert len(lg_k) == len(rows)
    for got, (kind, cell) in zip(lg_k.tolist(), rows, strict=True):
        assert got == (ds.hll_sketch.deserialize(cell).lg_config_k if kind == "sketch" else 0)  # NULL, KLL: 0


@SETTINGS
@given(columns(kll_cells(), hll_cells()))
def test_kll_level0_rows_hold_the_items_the_sketch_deserialises_with(column):
    array, rows = column
    blobs = Blobs(array)
    header = kll_level0_header(blobs)
    items, at = kll_items(blobs, header, header >= 0)
    assert len(header) == len(rows) and len(at) == len(rows) + 1
    for i, (kind, cell) in enumerate(rows):
        row = items[at[i]:at[i + 1]]
        if kind != "sketch":  # NULL: no items; an HLL sketch: refused
            assert header[i] == (0 if cell is None else -1) and not len(row)
            continue
        sketch = ds.kll_doubles_sketch.deserialize(cell)
        assert (header[i] >= 0) == (sketch.n == sketch.num_retained)  # level 0 only: each item weighs 1
        if header[i] < 0:
            assert not len(row)
            continue
        assert sorted(row.tolist()) == sorted(item for item, _ in sketch)
        assert len(row) == sketch.n
        if len(row):
            assert (row.min(), row.max()) == (sketch.get_min_value(), sketch.get_max_value())


def test_an_empty_column_has_no_rows():
    blobs = Blobs(pa.array([], pa.binary()))
    header = kll_level0_header(blobs)
    items, at = kll_items(blobs, header, header >= 0)
    assert (len(hll_lg_k(blobs)), len(header), len(items), at.tolist()) == (0, 0, 0, [0])


def test_rows_too_short_for_a_preamble_are_no_sketch():
    blobs = Blobs(pa.array([b"", b"\x02\x01\x0f", ds.kll_doubles_sketch(8).serialize()[:7]], pa.binary()))
    assert hll_lg_k(blobs).tolist() == [0, 0, 0]
    assert kll_level0_header(blobs).tolist() == [-1, -1, -1]


@SETTINGS
@given(columns(kll_cells(), kll_cells()), st.sampled_from([0.0, 0.05, 0.5, 0.95, 1.0]) | st.floats(0, 1),
       st.sampled_from(["double", "bigint", None]))
def test_kll_stored_values_are_the_quantiles_the_library_gives(column, q, input_type):
    """Percentiles read from the bytes of sketches that never compacted, decoded for the others: as ``get_value``."""
    array, rows = column
    fn = ApproxPercentile("p", ["x"], {"q": q}, input_type)
    assert fn.stored_values([array]).to_pylist() == [
        None if cell is None else fn.get_value(fn.decode([cell])) for _, cell in rows]


@SETTINGS
@given(columns(hll_cells(), hll_cells()))
def test_hll_stored_values_are_the_estimates_the_library_gives(column):
    """Estimates of sketches in list or set mode looked up by coupon count, the others decoded: as ``get_value``."""
    array, rows = column
    fn = ApproxCountDistinct("u", ["x"], {}, "bigint")
    assert fn.stored_values([array]).to_pylist() == [fn.get_value(fn.decode([cell])) for _, cell in rows]


def test_hll_sketches_with_one_coupon_count_have_one_estimate():
    """Many sketches of the same few sizes, each of other values, in list and set mode (the lookup's premise)."""
    rng = np.random.default_rng(7)
    cells = []
    for _ in range(400):
        sketch = ds.hll_sketch(int(rng.integers(8, 14)), HLL_TYPES[int(rng.integers(0, 3))])
        for v in rng.integers(0, 2**60, size=int(rng.choice([1, 2, 5, 30, 90, 200]))).tolist():
            sketch.update(v)
        cells.append(sketch.serialize_updatable() if rng.random() < 0.5 else sketch.serialize_compact())
    array = pa.array(cells, pa.binary())
    modes = {code >> 32 & 3 for code in hll_coupons(Blobs(array)).tolist() if code >= 0}
    assert modes == {0, 1}  # list and set mode both met
    fn = ApproxCountDistinct("u", ["x"], {}, "bigint")
    assert fn.stored_values([array]).to_pylist() == [fn.get_value(fn.decode([cell])) for cell in cells]
