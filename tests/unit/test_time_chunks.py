"""Reading a table a run of steps at a time: every step its files' statistics span is in exactly one run, and each run
names every file that may hold its rows."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.lake import time_chunks
from spark_jobs.lake.reader import FileSpan

T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)


def hour_floor(t: dt.datetime) -> dt.datetime:
    return t.replace(minute=0, second=0, microsecond=0)


files = st.lists(st.tuples(st.integers(0, 47), st.integers(0, 12), st.integers(1, 100)), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(files=files, budget=st.integers(1, 400), wanted=st.one_of(st.none(), st.lists(
    st.tuples(st.integers(0, 60), st.integers(1, 12)), max_size=3)))
def test_each_step_in_one_run_with_every_file_that_overlaps_it(files, budget, wanted):
    spans = [FileSpan(f"f{i}", size, T0 + start * HOUR + dt.timedelta(minutes=7), T0 + (start + length) * HOUR)
             for i, (start, length, size) in enumerate(files)]
    ranges = None if wanted is None else [(T0 + a * HOUR, T0 + (a + n) * HOUR) for a, n in wanted]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time_chunks, "CHUNK_BYTES", budget)
        chunks = time_chunks.time_chunks(spans, hour_floor, HOUR, ranges)
    assert chunks is not None
    spanned = {T0 + h * HOUR for start, length, _ in files for h in range(start, start + length + 1)}
    if ranges is not None:
        spanned = {s for s in spanned if any(lo <= s < hi for lo, hi in ranges)}
    steps = [lo + k * HOUR for c in chunks for lo, hi in c.ranges for k in range((hi - lo) // HOUR)]
    assert sorted(steps) == sorted(spanned)  # each step once
    for c in chunks:
        for span in spans:
            overlaps = any(lo <= hour_floor(span.high) and hour_floor(span.low) < hi for lo, hi in c.ranges)
            assert (span.uri in c.uris) == overlaps


def test_runs_stay_near_the_budget_and_a_file_without_statistics_means_no_runs(monkeypatch):
    spans = [FileSpan(f"day{d}", 100, T0 + d * 24 * HOUR, T0 + (d * 24 + 23) * HOUR) for d in range(6)]
    monkeypatch.setattr(time_chunks, "CHUNK_BYTES", 200)
    chunks = time_chunks.time_chunks(spans, hour_floor, HOUR)
    assert [c.uris for c in chunks] == [("day0", "day1"), ("day2", "day3"), ("day4", "day5")]
    assert time_chunks.time_chunks([*spans, FileSpan("bare", 10, None, None)], hour_floor, HOUR) is None
