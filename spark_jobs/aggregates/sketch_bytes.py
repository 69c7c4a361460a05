"""DataSketches' serialised bytes, read by hand: the one module that does.

The column-wise merges of stored HLL and KLL sketches (``merge_groups``) read a few header bytes, and a KLL sketch's
items, straight from a binary column's buffer instead of deserialising every row. The layouts are DataSketches' own,
shared by its C++ (``datasketches``) and Java (Spark's ``hll_*``/``kll_*``) libraries: the diagrams in Java's
``hll.PreambleUtil`` and ``kll.KllPreambleUtil``, the constants in C++'s ``HllSketchImpl.hpp`` and ``kll_sketch.hpp``.
All numbers are little-endian.

HLL sketch, updatable or compact serialisation, any mode (list, set or HLL array): an 8-byte preamble,
byte 0 preamble ints, 1 serial version, 2 family (7), 3 lg_k, 4 lg of the coupon array, 5 flags,
6 list count or current minimum, 7 mode (current mode in bits 0-1: 0 list, 1 set, 2 HLL array; target HLL type);
the mode's data follows, a set's coupon count (uint32) first, at byte 8.

KLL doubles sketch: the same first three bytes (family 15), then 3 flags (bit 0 empty, bit 1 level 0
sorted, bit 2 one item), 4-5 ``k``, 6 ``m`` (8), 7 unused. Then, by layout:

- empty: nothing more (preamble ints 2, serial version 1, the empty flag): 8 bytes.
- one item: preamble ints 2, serial version 2, the one-item flag, the item at byte 8: 16 bytes.
- full: preamble ints 5, serial version 1; ``n`` (uint64) at byte 8, min ``k`` (uint16) at 16, the number
  of levels (uint8) at 18; from byte 20 each level's start (uint32, the top level's end omitted), then the
  minimum and maximum items, then the retained items, level 0 first. A sketch that never compacted
  has one level, so its start at 20, its minimum at 24, its maximum at 32 and its ``n`` items from 40.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["Blobs", "hll_coupons", "hll_lg_k", "kll_items", "kll_level0_header"]

# the preamble's first 8 bytes, HLL and KLL alike: where each field is
PREAMBLE_BYTES = 8
PREAMBLE_INTS, SERIAL_VERSION, FAMILY = 0, 1, 2
HLL_LG_K, KLL_FLAGS, KLL_M = 3, 3, 6
HLL_LIST_COUNT, HLL_MODE, HLL_SET_COUNT_AT = 6, 7, 8
HLL_LIST, HLL_SET = 0, 1  # current modes
HLL_FAMILY, KLL_FAMILY = 7, 15
KLL_DEFAULT_M = 8
KLL_PREAMBLE_INTS_SHORT, KLL_PREAMBLE_INTS_FULL = 2, 5  # empty or one item; full
KLL_SERIAL_VERSION, KLL_SERIAL_VERSION_SINGLE = 1, 2  # empty or full; one item
KLL_EMPTY, KLL_LEVEL0_SORTED, KLL_SINGLE_ITEM = 1, 2, 4  # flag bits
KLL_SINGLE_ITEM_AT = 8  # where a one-item sketch's item is
KLL_N = 8  # full layout: n, 8 bytes
KLL_NUM_LEVELS = 18  # full layout: the number of levels, 1 byte
KLL_ONE_LEVEL_ITEMS_AT = 40  # full layout with one level: where its items start
ITEM_BYTES = 8  # a float64 item


class Blobs:
    """A binary column's bytes: the values buffer, each row's offsets and validity, without a Python object per row."""

    def __init__(self, array: pa.Array) -> None:
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if not pa.types.is_binary(array.type):
            array = array.cast(pa.binary())
        n, base = len(array), array.offset
        validity, offsets, data = array.buffers()
        self.offsets = np.frombuffer(offsets, dtype=np.int32)[base:base + n + 1].astype(np.int64) if n else (
            np.zeros(1, dtype=np.int64))
        self.valid = (np.ones(n, dtype=bool) if validity is None or array.null_count == 0
                      else np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
        self.view = memoryview(data if data is not None else b"")
        self.array = array

    def cell(self, i: int) -> bytes | None:
        return bytes(self.view[self.offsets[i]:self.offsets[i + 1]]) if self.valid[i] else None

    def preambles(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows at least a preamble long (non-NULL), and their first ``PREAMBLE_BYTES`` bytes (a row each)."""
        rows = np.flatnonzero(self.valid & (np.diff(self.offsets) >= PREAMBLE_BYTES))
        data = np.frombuffer(self.view, dtype=np.uint8)
        return rows, data[self.offsets[rows][:, None] + np.arange(PREAMBLE_BYTES)]


def hll_lg_k(blobs: Blobs) -> np.ndarray:
    """Per row, the ``lg_k`` its HLL sketch was built with; 0 for NULL and for a row that is no HLL sketch."""
    lg_k = np.zeros(len(blobs.valid), dtype=np.int64)
    rows, h = blobs.preambles()
    hll = h[:, FAMILY] == HLL_FAMILY
    lg_k[rows[hll]] = h[hll, HLL_LG_K]
    return lg_k


def hll_coupons(blobs: Blobs) -> np.ndarray:
    """Per row, for an HLL sketch in list or set mode (few distinct values: its estimate is a function of its coupon
    count), one number naming its ``lg_k``, mode and coupon count; -1 for NULL, a sketch in HLL mode and a row that is
    no HLL sketch."""
    out = np.full(len(blobs.valid), -1, dtype=np.int64)
    rows, h = blobs.preambles()
    hll, mode = h[:, FAMILY] == HLL_FAMILY, h[:, HLL_MODE].astype(np.int64) & 3
    count = h[:, HLL_LIST_COUNT].astype(np.int64)
    in_set = hll & (mode == HLL_SET) & (np.diff(blobs.offsets)[rows] >= HLL_SET_COUNT_AT + 4)
    data = np.frombuffer(blobs.view, dtype=np.uint8)
    at = blobs.offsets[rows[in_set]][:, None] + HLL_SET_COUNT_AT + np.arange(4)
    count[in_set] = np.ascontiguousarray(data[at]).view("<u4").ravel()
    coupon = (hll & (mode == HLL_LIST)) | in_set
    out[rows[coupon]] = (h[coupon, HLL_LG_K].astype(np.int64) << 40) | (mode[coupon] << 32) | count[coupon]
    return out


def kll_level0_header(blobs: Blobs) -> np.ndarray:
    """Per row, the bytes before its items when its KLL doubles sketch holds them in level 0 only (its ``n``
    items, none compacted): 40 for the full layout with one level, 8 for one item and for an empty sketch,
    0 for NULL (no items). -1 for any other row (compacted, or not a KLL doubles sketch)."""
    size = np.diff(blobs.offsets)
    header = np.full(len(size), -1, dtype=np.int64)
    header[~blobs.valid] = 0
    rows, h = blobs.preambles()
    version, flags, sized = h[:, SERIAL_VERSION], h[:, KLL_FLAGS] | KLL_LEVEL0_SORTED, size[rows]  # sorted or not
    kll = (h[:, FAMILY] == KLL_FAMILY) & (h[:, KLL_M] == KLL_DEFAULT_M)
    short = kll & (h[:, PREAMBLE_INTS] == KLL_PREAMBLE_INTS_SHORT)
    empty = rows[short & (version == KLL_SERIAL_VERSION) & ((flags & KLL_EMPTY) > 0) & (sized == PREAMBLE_BYTES)]
    single = rows[short & (version == KLL_SERIAL_VERSION_SINGLE) & (flags == (KLL_SINGLE_ITEM | KLL_LEVEL0_SORTED))
                  & (sized == KLL_SINGLE_ITEM_AT + ITEM_BYTES)]
    full = rows[kll & (h[:, PREAMBLE_INTS] == KLL_PREAMBLE_INTS_FULL) & (version == KLL_SERIAL_VERSION)
                & ((flags & (KLL_EMPTY | KLL_SINGLE_ITEM)) == 0) & (sized >= KLL_ONE_LEVEL_ITEMS_AT)]
    data = np.frombuffer(blobs.view, dtype=np.uint8)
    start = blobs.offsets[full]
    n = data[start[:, None] + np.arange(KLL_N, KLL_N + 8)].copy().view("<u8").ravel()
    full = full[(data[start + KLL_NUM_LEVELS] == 1) & (n < 2**31)
                & (size[full] == KLL_ONE_LEVEL_ITEMS_AT + ITEM_BYTES * n.astype(np.int64))]
    header[empty], header[single], header[full] = PREAMBLE_BYTES, KLL_SINGLE_ITEM_AT, KLL_ONE_LEVEL_ITEMS_AT
    return header


def kll_items(blobs: Blobs, header: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float64 items of the ``rows`` (a mask of rows ``kll_level0_header`` accepted, ``header`` its
    answer) concatenated in row order, and ``at``: row ``i``'s items are ``items[at[i]:at[i + 1]]``, none
    for the other rows. Gathered per byte alignment by NumPy, without a Python object per row."""
    start, stop = blobs.offsets[:-1], blobs.offsets[1:]
    at = np.zeros(len(header) + 1, dtype=np.int64)
    np.cumsum(np.where(rows, stop - start - header, 0) // ITEM_BYTES, out=at[1:])
    begin = np.where(rows, start + header, 0)
    items = np.empty(int(at[-1]), dtype=np.float64)
    counts = np.diff(at)
    shift = begin % ITEM_BYTES
    for s in range(ITEM_BYTES):
        fed = np.flatnonzero((shift == s) & (counts > 0))
        if not len(fed):
            continue
        n = counts[fed]
        rel = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)  # each item's place in its row
        aligned = np.frombuffer(blobs.view, dtype="<f8", count=(len(blobs.view) - s) // ITEM_BYTES, offset=s)
        items[np.repeat(at[fed], n) + rel] = aligned[np.repeat((begin[fed] - s) // ITEM_BYTES, n) + rel]
    return items, at
