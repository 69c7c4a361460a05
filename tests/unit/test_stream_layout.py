"""How a mini-batch lays out its ``aggregates`` rewrite: about a file per window it spans, none of too few rows."""

from __future__ import annotations

import datetime as dt

from spark_jobs.lake.table_rules import STREAM_FILE_ROWS, stream_layout
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
