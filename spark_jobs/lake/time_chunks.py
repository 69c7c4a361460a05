"""A table read a time range at a time, so a job over all its rows (a full rollup refresh, the changelog of a full
reduce) holds a few ranges' rows at once: runs of whole steps (a rollup's buckets, days) of at most
:data:`CHUNK_BYTES` of data files, a file's bytes spread evenly over the steps its statistics span. A file across two
runs is read by both, each for its own rows."""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable, Iterable, Sequence
from functools import reduce
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.lake.reader import FileSpan

__all__ = ["CHUNK_BYTES", "TimeChunk", "in_ranges", "merged_spans", "time_chunks"]

CHUNK_BYTES = 4 << 20  # data file bytes read at once (and once per core where the reads run on every core)
_EPOCH, _US = dt.datetime(1970, 1, 1, tzinfo=dt.UTC), dt.timedelta(microseconds=1)


class TimeChunk(NamedTuple):
    """Ranges [start, end) of a time column and the data files that may hold their rows."""

    uris: tuple[str, ...]
    ranges: tuple[tuple[dt.datetime, dt.datetime], ...]


def time_chunks(spans: Sequence[FileSpan] | None, floor: Callable[[dt.datetime], dt.datetime], step: dt.timedelta,
                wanted: Sequence[tuple[dt.datetime, dt.datetime]] | None = None) -> list[TimeChunk] | None:
    """The steps (``floor`` gives a time's step start) that the files span and ``wanted`` holds (all when None), in
    runs; None without the files' statistics."""
    if spans is None or any(s.low is None or s.high is None for s in spans):
        return None
    width = step // _US
    files = [(_micros(floor(s.low)), _micros(floor(s.high)) + width, s) for s in spans]
    weight: dict[int, float] = {}  # each step's share of the files' bytes
    for lo, hi, span in files:
        for start in range(lo, hi, width):
            weight[start] = weight.get(start, 0.0) + span.size * width / (hi - lo)
    bounds = None if wanted is None else [(_micros(lo), _micros(hi)) for lo, hi in wanted]
    runs: list[list[int]] = [[]]
    total = 0.0
    for start in sorted(s for s in weight if bounds is None or any(lo <= s < hi for lo, hi in bounds)):
        if runs[-1] and total + weight[start] > CHUNK_BYTES:
            runs.append([])
            total = 0.0
        runs[-1].append(start)
        total += weight[start]
    chunks = []
    for run in filter(None, runs):
        ranges = merged_spans([(s, s + width) for s in run])
        uris = tuple(s.uri for lo, hi, s in files if any(lo < b and hi > a for a, b in ranges))
        chunks.append(TimeChunk(uris, tuple((_EPOCH + a * _US, _EPOCH + b * _US) for a, b in ranges)))
    return chunks


def merged_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """[lo, hi) spans merged where they overlap or touch, in order."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def in_ranges(column: str, ranges: Iterable[tuple[dt.datetime, dt.datetime]]) -> pc.Expression:
    """Rows whose ``column`` lies in one of the [start, end) ``ranges`` (none: no row)."""
    ts = pa.timestamp("us", tz="UTC")
    terms = [(pc.field(column) >= pa.scalar(lo, ts)) & (pc.field(column) < pa.scalar(hi, ts)) for lo, hi in ranges]
    return reduce(operator.or_, terms) if terms else pc.scalar(False)


def _micros(t: dt.datetime) -> int:
    return (t - _EPOCH) // _US
