"""Session windows in batch: partial sessions per day merged by the reduce, equal to DuckDB's gaps and islands.

A session is [first event, last event + gap) per key; an event at or before ``last + gap`` joins it. combine
cuts each day's events into partial sessions; the reduce merges the partials that touch, for every key a
change touched, so a session that crosses midnight, or that a re-combined day bridges or splits, is served
once and whole. The oracle sessionises the raw rows with ``lag(event_time)`` per key.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from spark_jobs.errors import UsageError
from spark_jobs.jobs import combine, reduce, stream
from spark_jobs.jobs.apply import apply
from spark_jobs.lake import PipelineTables
from spark_jobs.plan.explain import explain
from spark_jobs.plan.phases import CompiledAggregates
from spark_jobs.session import ensure_java_home
from tests.builders import ALL_AGGREGATES, FAST_AGGREGATES, events, make_spec, write_day
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]
DAY0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
SESSION = {"gap": "30 minutes"}


def at(day: int, hh: int, mm: int = 0, ss: int = 0, us: int = 0) -> dt.datetime:
    return DAY0 + dt.timedelta(days=day, hours=hh, minutes=mm, seconds=ss, microseconds=us)


def ev(t: dt.datetime, user: str, ms: int | None = 100, page: str = "/a") -> tuple:
    return (t, user, page, ms, 1.0, "DE")


def land(root: Path, rows: list[tuple], files: int = 2) -> list[str]:
    by_day: dict[str, list[tuple]] = {}
    for r in rows:
        by_day.setdefault(r[0].date().isoformat(), []).append(r)
    for day, day_rows in by_day.items():
        write_day(root / "landing", day, events(day_rows), files=min(files, len(day_rows)))
    return sorted(by_day)


def check(spec, root: Path) -> pd.DataFrame:
    tables = PipelineTables(spec.lake, spec.name)
    got = actual(tables.aggregates, spec)
    assert_matches(got, expected(read_landing(root / "landing"), spec), spec)
    assert not got.duplicated(list(spec.key_columns)).any()
    return got


MIDNIGHT = [  # u1: one session across midnight that grows by events exactly 30 minutes apart, then a new one
    ev(at(0, 23, 50), "u1"), ev(at(1, 0, 10), "u1"), ev(at(1, 0, 40), "u1"), ev(at(1, 1, 10), "u1", None),
    ev(at(1, 1, 40, 0, 1), "u1"),  # 30 minutes and 1 microsecond after the last: a session of its own
    ev(at(0, 8), "u2", 5), ev(at(0, 8, 29), "u2", 7), ev(at(1, 8), "u2", 9),
]


@pytest.mark.parametrize("aggregates", [FAST_AGGREGATES, ALL_AGGREGATES], ids=["built-in", "with-udaf"])
def test_a_session_across_midnight_is_served_once_and_whole(spark, tmp_path, aggregates):
    spec = make_spec(tmp_path, window=SESSION, group_by=["user_id"], aggregates=aggregates)
    for day in land(tmp_path, MIDNIGHT):
        combine.run(spark, spec, day)
    reduce.run(spark, spec)
    got = check(spec, tmp_path)
    u1 = got[got["user_id"] == "u1"].sort_values("window_start")
    assert [(r.window_start.to_pydatetime(), r.window_end.to_pydatetime(), r.n_rows) for r in u1.itertuples()] == [
        (at(0, 23, 50), at(1, 1, 40), 4), (at(1, 1, 40, 0, 1), at(1, 2, 10, 0, 1), 1)]
    assert sorted(got[got["user_id"] == "u2"]["n_rows"]) == [1, 2]


def test_a_recombined_middle_day_bridges_and_splits_sessions(spark, tmp_path):
    spec = make_spec(tmp_path, window={"gap": "6 hours"}, group_by=["user_id"], aggregates=FAST_AGGREGATES)
    chain = [ev(at(0, 22), "u1"), *(ev(at(1, h), "u1") for h in (3, 8, 13, 18, 23)), ev(at(2, 4), "u1"),
             ev(at(0, 1), "u2"), ev(at(2, 1), "u2")]
    days = land(tmp_path, chain)
    for day in (days[2], days[0], days[1]):  # any order
        combine.run(spark, spec, day)
        reduce.run(spark, spec)
    assert len(check(spec, tmp_path).query("user_id == 'u1'")) == 1  # three days, one session
    land(tmp_path, [r for r in chain if r[0] != at(1, 13) and r[0].date() == at(1, 0).date()])
    combine.run(spark, spec, days[1])  # 08:00 -> 18:00 is more than 6 hours: the session splits
    reduce.run(spark, spec)
    assert len(check(spec, tmp_path).query("user_id == 'u1'")) == 2
    land(tmp_path, [r for r in chain if r[0].date() == at(1, 0).date()] + [ev(at(1, 2), "u2")])
    combine.run(spark, spec, days[1])  # back whole, and u2's two days are bridged by nothing: still apart
    reduce.run(spark, spec)
    got = check(spec, tmp_path)
    assert len(got.query("user_id == 'u1'")) == 1 and len(got.query("user_id == 'u2'")) == 3


event = st.tuples(st.integers(0, 2), st.integers(0, 47), st.integers(0, 1799), st.sampled_from(["u1", "u2", "u3"]),
                  st.sampled_from(["/a", "/b"]), st.one_of(st.none(), st.integers(0, 1000)))


@settings(max_examples=6, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(event, min_size=1, max_size=50), files=st.integers(1, 3), order=st.randoms(use_true_random=False),
       reduce_between=st.booleans(), group_by=st.sampled_from([["user_id"], ["user_id", "page"], []]))
def test_any_split_into_days_files_and_combine_orders_gives_the_oracle(spark, tmp_path_factory, rows, files, order,
                                                                       reduce_between, group_by):
    # times on a half-hour grid plus jitter below 30 minutes: gaps fall on both sides of the gap, and at it
    root = tmp_path_factory.mktemp("sessions")
    spec = make_spec(root, window=SESSION, group_by=group_by, aggregates=FAST_AGGREGATES)
    landed = [ev(at(d, 0) + dt.timedelta(minutes=30 * slot, seconds=s), user, ms, page)
              for d, slot, s, user, page, ms in rows]
    days = land(root, landed, files)
    order.shuffle(days)
    for i, day in enumerate(days):
        combine.run(spark, spec, day)
        if reduce_between and i % 2 == 0:
            reduce.run(spark, spec)
    reduce.run(spark, spec)
    check(spec, root)
    shutil.rmtree(root)


@pytest.mark.slow
def test_a_kill_after_the_aggregates_commit_then_a_rerun(spark, tmp_path):
    spec = make_spec(tmp_path, window=SESSION, group_by=["user_id"], aggregates=FAST_AGGREGATES)
    days = land(tmp_path, MIDNIGHT)
    combine.run(spark, spec, days[0])
    reduce.run(spark, spec)
    combine.run(spark, spec, days[1])
    ensure_java_home()
    env = {**os.environ, "SPARK_JOBS_FAILPOINT": "commit:aggregates:before", "SPARK_JOBS_DELTA_BACKEND": "embedded",
           "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, "-m", "spark_jobs", "reduce", "--pipeline", spec.origin, "--master",
                           "local[1]", "--shuffle-partitions", "2"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    reduce.run(spark, spec)
    check(spec, tmp_path)


def test_the_stream_refuses_and_explain_shows_the_merge(spark, tmp_path):
    spec = make_spec(tmp_path, window=SESSION, group_by=["user_id"], aggregates=FAST_AGGREGATES)
    with pytest.raises(UsageError, match="session windows, which run in batch"):
        stream.run(spark, spec, available_now=True)
    text = explain(spark, CompiledAggregates(spec), "reduce")
    assert "session merge" in text and "starts at or before the latest end" in text
    assert "a new session after a gap of more than 30 minutes" in explain(spark, CompiledAggregates(spec), "combine")


def test_apply_drops_an_aggregate_then_a_backfill_fills_one_added(spark, tmp_path):
    spec = make_spec(tmp_path, window=SESSION, group_by=["user_id"], aggregates=FAST_AGGREGATES)
    days = land(tmp_path, MIDNIGHT)
    for day in days:
        combine.run(spark, spec, day)
    reduce.run(spark, spec)
    fewer = make_spec(tmp_path, window=SESSION, group_by=["user_id"], aggregates=FAST_AGGREGATES[:-1])
    assert apply(fewer).plan.diff.derives
    assert FAST_AGGREGATES[-1]["name"] not in check(fewer, tmp_path).columns  # the sessions stand, one column less
    again = make_spec(tmp_path, window=SESSION, group_by=["user_id"], aggregates=FAST_AGGREGATES)
    apply(again)
    tables = PipelineTables(spec.lake, spec.name)
    assert actual(tables.aggregates, again)[FAST_AGGREGATES[-1]["name"]].isna().all()  # NULL until recombined
    for day in days:
        combine.run(spark, again, day)
    reduce.run(spark, again)
    check(again, tmp_path)
