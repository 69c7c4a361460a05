"""Session windows in batch: partial sessions per day merged by the reduce, equal to DuckDB's gaps and islands.

A session is [first event, last event + gap) per key; an event at or before ``last + gap`` joins it. combine
cuts each day's events into partial sessions; the reduce merges the partials that touch, for every key a
change touched, so a session that crosses midnight, or that a re-combined day bridges or splits, is served
once and whole. The oracle sessionises the raw rows with ``lag(event_time)`` per key.
"""

from __future__ import annotations

import datetime as dt
import itertools
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from spark_jobs.jobs import combine, reduce
from spark_jobs.jobs.apply import apply
from spark_jobs.lake import PipelineTables
from spark_jobs.phases.compiled import CompiledAggregates
from spark_jobs.phases.explain import explain
from spark_jobs.spec import PipelineSpec
from spark_jobs.stream import query as stream
from spark_jobs.stream.arrow_engine import DRIVER_MAX_KEYS
from tests.builders import ALL_AGGREGATES, FAST_AGGREGATES, events, killed_at, make_spec, write_day
from tests.integration.test_stream import land as land_one
from tests.integration.test_stream import with_stream
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark
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
def test_a_kill_after_the_aggregates_commit_then_a_rerun(spark, spark_server, tmp_path):
    spec = make_spec(tmp_path, window=SESSION, group_by=["user_id"], aggregates=FAST_AGGREGATES)
    days = land(tmp_path, MIDNIGHT)
    combine.run(spark, spec, days[0])
    reduce.run(spark, spec)
    combine.run(spark, spec, days[1])
    killed_at("commit:aggregates:before", "reduce", "--pipeline", spec.origin, remote=spark_server.remote)
    reduce.run(spark, spec)
    check(spec, tmp_path)


def test_explain_shows_the_session_merge(spark, tmp_path):
    spec = make_spec(tmp_path, window=SESSION, group_by=["user_id"], aggregates=FAST_AGGREGATES)
    text = explain(spark, CompiledAggregates(spec), "reduce")
    assert "session merge" in text and "starts at or before the latest end" in text
    assert "a new session after a gap of more than 30 minutes" in explain(spark, CompiledAggregates(spec), "combine")


# ------------------------------------------------------------------------------------------- stream


def streaming(root: Path, *, watermark: str = "1 day", **kw) -> PipelineSpec:
    spec = make_spec(root, window=SESSION, group_by=["user_id"], aggregates=FAST_AGGREGATES, **kw)
    return with_stream(spec, max_files_per_batch=1, watermark=watermark)


def land_file(root: Path, rows: list[tuple]) -> None:
    """One landing file per call, in its day's partition (as a live source lands them)."""
    for day in {r[0].date().isoformat() for r in rows}:
        land_one(root / "landing", day, events([r for r in rows if r[0].date().isoformat() == day]))


def folded(spec: PipelineSpec) -> dict[tuple, tuple]:
    """The changelog applied in order, by session (key and start): its end and views."""
    log = DeltaTable(PipelineTables(spec.lake, spec.name).changelog).to_pandas().sort_values(["batch_id", "seq"])
    out: dict[tuple, tuple] = {}
    for row in log.itertuples():
        key = (row.user_id, row.window_start)
        if row.op in ("+I", "+U"):
            out[key] = (row.window_end, row.views)
        else:
            out.pop(key, None)
    return out


def served(spec: PipelineSpec, root: Path) -> dict[tuple, tuple]:
    got = check(spec, root)
    return {(r.user_id, r.window_start): (r.window_end, r.views) for r in got.itertuples()}


def test_the_stream_cuts_the_sessions_the_batch_path_does_and_its_changelog_folds_to_them(spark, tmp_path):
    spec = streaming(tmp_path)
    for r in sorted(MIDNIGHT):
        land_file(tmp_path, [r])
    summary = stream.run(spark, spec, available_now=True)
    assert len(summary.batches) == len(MIDNIGHT)
    assert folded(spec) == served(spec, tmp_path)


def test_a_late_event_bridging_two_served_sessions_merges_them(spark, tmp_path):
    spec = streaming(tmp_path)
    land_file(tmp_path, [ev(at(0, 10), "u1"), ev(at(0, 11), "u1")])
    stream.run(spark, spec, available_now=True)
    assert len(served(spec, tmp_path)) == 2
    land_file(tmp_path, [ev(at(0, 10, 30), "u1")])  # 30 minutes after one, 30 before the other
    stream.run(spark, spec, available_now=True)
    assert served(spec, tmp_path) == {("u1", pd.Timestamp(at(0, 10))): (pd.Timestamp(at(0, 11, 30)), 3)}
    log = DeltaTable(PipelineTables(spec.lake, spec.name).changelog).to_pandas()
    last = log[log["batch_id"] == log["batch_id"].max()].sort_values("seq")
    assert [(r.op, r.window_start.to_pydatetime(), r.window_end.to_pydatetime(), r.views) for r in last.itertuples()] \
        == [("-U", at(0, 10), at(0, 10, 30), 1), ("+U", at(0, 10), at(0, 11, 30), 3),
            ("-D", at(0, 11), at(0, 11, 30), 1)]
    assert folded(spec) == served(spec, tmp_path)


def test_a_batch_day_supersedes_the_streams_and_the_next_day_streams_on_across_midnight(spark, tmp_path):
    spec = streaming(tmp_path)
    land_file(tmp_path, [ev(at(0, 22), "u1"), ev(at(0, 23, 40), "u2")])
    land_file(tmp_path, [ev(at(0, 23, 50), "u1", 7)])
    stream.run(spark, spec, available_now=True)
    combine.run(spark, spec, at(0, 0).date().isoformat())  # the batch combine of the day counts instead
    reduce.run(spark, spec)
    served(spec, tmp_path)
    land_file(tmp_path, [ev(at(1, 0, 15), "u1"), ev(at(1, 0, 5), "u2")])  # across midnight, into the batch day
    stream.run(spark, spec, available_now=True)
    sessions = served(spec, tmp_path)
    assert sessions[("u1", pd.Timestamp(at(0, 23, 50)))] == (pd.Timestamp(at(1, 0, 45)), 2)
    assert sessions[("u2", pd.Timestamp(at(0, 23, 40)))] == (pd.Timestamp(at(1, 0, 35)), 2)


def rewritten_files(table: str) -> list[list[pd.Timestamp]]:
    """Per version of a Delta table after its first: the smallest ``window_end`` of each file it removed."""
    def files(version: int) -> dict[str, pd.Timestamp]:
        actions = pa.table(DeltaTable(table, version=version).get_add_actions(flatten=True)).to_pydict()
        return dict(zip(actions["path"], map(pd.Timestamp, actions["min.window_end"]), strict=True))

    snapshots = [files(v) for v in range(DeltaTable(table).version() + 1)]
    return [[ends[p] for p in ends.keys() - now.keys()] for ends, now in itertools.pairwise(snapshots)]


@pytest.mark.parametrize("driver_max_keys", [DRIVER_MAX_KEYS, 0], ids=["driver", "spark"])
def test_a_batch_rewrites_only_the_sessions_still_open_not_every_session_of_the_day(spark, tmp_path,
                                                                                   driver_max_keys):
    """The sessions a later batch may still change (ending past the batch's last event, less the watermark and the
    gap) are written to a file of their own, and the next batch rewrites that file alone. Before, a batch of under a
    day wrote one file, which every later batch of the day rewrote with its new sessions: each batch rewrote every
    session of the day so far."""
    spec = streaming(tmp_path, watermark="10 minutes")
    hours = range(4)
    for h in hours:  # u1: one session growing all along; u2, u3: sessions that close each hour
        land_file(tmp_path, [ev(at(0, h, m), "u1") for m in (0, 20, 40)] + [ev(at(0, h, 5), "u2"),
                             ev(at(0, h, 10), "u3"), ev(at(0, h, 15), "u3")])
    summary = stream.run(spark, spec, available_now=True, driver_max_keys=driver_max_keys)
    assert len(summary.batches) == len(hours)
    assert {b.on_driver for b in summary.batches} == {driver_max_keys > 0}
    check(spec, tmp_path)
    assert folded(spec) == served(spec, tmp_path)
    removed = rewritten_files(PipelineTables(spec.lake, spec.name).aggregates)
    assert len(removed) == len(hours) - 1 and all(removed), removed  # u1's open session: its file, each batch
    for h, ends in zip(hours, removed, strict=False):  # batch h + 1 rewrote what batch h left open
        open_from = pd.Timestamp(at(0, h, 40) - dt.timedelta(minutes=10 + 30))
        assert min(ends) >= open_from, (h, ends)


@pytest.mark.slow
@settings(max_examples=3, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(event, min_size=1, max_size=40), cuts=st.lists(st.integers(1, 39), max_size=5),
       order=st.randoms(use_true_random=False), combined=st.integers(0, 2))
def test_any_split_into_mini_batches_then_a_batch_day_gives_the_oracle(spark, tmp_path_factory, rows, cuts, order,
                                                                       combined):
    """Events out of order in random mini-batches (a file per batch and day), then a day combined and reduced:
    the served sessions equal DuckDB's after the stream and after the batch, and the changelog folds to them."""
    root = tmp_path_factory.mktemp("stream-sessions")
    spec = streaming(root, watermark="3 days")
    landed = [ev(at(d, 0) + dt.timedelta(minutes=30 * slot, seconds=s), user, ms, page)
              for d, slot, s, user, page, ms in rows]
    order.shuffle(landed)
    bounds = sorted({0, len(landed), *(c for c in cuts if c < len(landed))})
    for lo, hi in itertools.pairwise(bounds):
        land_file(root, landed[lo:hi])
    stream.run(spark, spec, available_now=True)
    assert folded(spec) == served(spec, root)
    day = at(combined, 0).date().isoformat()
    if any(r[0].date().isoformat() == day for r in landed):
        combine.run(spark, spec, day)  # its batch partials count instead of the stream's
        reduce.run(spark, spec)
        check(spec, root)
    shutil.rmtree(root)


@pytest.mark.slow
def test_a_kill_after_the_streams_aggregates_commit_then_a_restart(spark, tmp_path):
    spec = streaming(tmp_path)
    first, rest = MIDNIGHT[:3], MIDNIGHT[3:]
    land_file(tmp_path, first)
    stream.run(spark, spec, available_now=True)
    land_file(tmp_path, rest)
    killed_at("commit:changelog:before", "stream", "--pipeline", spec.origin, "--available-now")
    stream.run(spark, spec, available_now=True)  # replays the batch: the tables it committed skip it
    assert folded(spec) == served(spec, tmp_path)


def test_apply_drops_an_aggregate_then_a_backfill_fills_one_added(spark, tmp_path):
    spec = make_spec(tmp_path, window=SESSION, group_by=["user_id"], aggregates=FAST_AGGREGATES)
    days = land(tmp_path, MIDNIGHT)
    combine.run(spark, spec, days[0])
    reduce.run(spark, spec)
    combine.run(spark, spec, days[1])  # not reduced yet when the spec changes
    fewer = make_spec(tmp_path, window=SESSION, group_by=["user_id"], aggregates=FAST_AGGREGATES[:-1])
    assert apply(fewer).plan.diff.derives
    reduce.run(spark, fewer)  # merges what aggregates had not
    assert FAST_AGGREGATES[-1]["name"] not in check(fewer, tmp_path).columns  # the sessions stand, one column less
    again = make_spec(tmp_path, window=SESSION, group_by=["user_id"], aggregates=FAST_AGGREGATES)
    apply(again)
    tables = PipelineTables(spec.lake, spec.name)
    assert actual(tables.aggregates, again)[FAST_AGGREGATES[-1]["name"]].isna().all()  # NULL until recombined
    for day in days:
        combine.run(spark, again, day)
    reduce.run(spark, again)
    check(again, tmp_path)
