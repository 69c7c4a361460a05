"""How a mini-batch lays out its ``aggregates`` rewrite: about a file per window it spans, none of too few rows."""

from __future__ import annotations

import datetime as dt

import pytest

from spark_jobs.lake.table_rules import STREAM_FILE_ROWS, partition_day, stream_layout
from tests.builders import make_spec

T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)


def test_a_batch_writes_about_a_file_per_window_of_8192_rows_at_least(tmp_path):
    spec = make_spec(tmp_path, window={"size": "1 hour"})
    live = (T0, T0 + dt.timedelta(minutes=90))  # starts in (t - 1 h, t]: the hour before and two of its own
    prune, cluster = stream_layout(spec, live, rows=50_000)
    assert prune == ("window_start", T0 - dt.timedelta(hours=1), live[1])
    assert cluster is not None and cluster.files == 3
    assert stream_layout(spec, live, rows=5_000)[1].files == 1  # a live batch of a few thousand rows: one file
    backlog = (T0, T0 + dt.timedelta(days=6))  # a batch of a backlog: 145 windows
    assert stream_layout(spec, backlog)[1].files == 6 * 24 + 2  # rows unknown (a Spark merge): one a window
    assert stream_layout(spec, backlog, rows=31_000)[1].files == -(-31_000 // STREAM_FILE_ROWS)
    assert stream_layout(spec, backlog, rows=10)[1].files == 1
    assert stream_layout(make_spec(tmp_path, name="nowin"), backlog, rows=31_000) == (None, None)


def test_sessions_a_later_batch_may_still_change_get_a_file_of_their_own(tmp_path):
    """Sessions are laid out by end, a file per day of the batch, and the ones ending past its last event less the
    watermark and the gap (the open ones) in a file of their own, which the next batch rewrites alone."""
    import pyarrow as pa

    from spark_jobs.lake.arrow import file_layout

    spec = make_spec(tmp_path, window={"gap": "30 minutes"})  # the stream's watermark: 10 minutes by default
    span = (T0, T0 + dt.timedelta(days=2, hours=5))
    prune, cluster = stream_layout(spec, span, rows=50_000)
    assert prune is None and cluster is not None
    assert (cluster.column, cluster.files) == ("window_end", 3)
    assert cluster.tail_from == span[1] - dt.timedelta(minutes=40)
    ends = [T0 + dt.timedelta(hours=h) for h in range(0, 54)]
    rows = pa.table({"window_end": pa.array(ends, pa.timestamp("us", "UTC")), "n": list(range(len(ends)))})
    pieces = [table for _, table in file_layout(rows, cluster, (), ())]
    assert sum(p.num_rows for p in pieces) == rows.num_rows
    *head, tail = pieces
    assert tail.column("window_end").to_pylist() == [e for e in ends if e >= cluster.tail_from]
    assert all(max(p.column("window_end").to_pylist()) < cluster.tail_from for p in head)


@pytest.mark.parametrize(("name", "day"), [("event_date=2024-03-01", "2024-03-01"), ("event_date=2024-02-30", None),
                                           ("event_date=20240301", None), ("2024-03-01", None), ("event_date=", None)])
def test_a_partition_directory_names_a_day_only_as_event_date_and_an_iso_date(name, day):
    """The stream and the batch read ``event_date`` as a date (parsed once a file) only when every file's directory
    holds one; ``plan`` lists landing days the same way."""
    assert partition_day(name) == day
