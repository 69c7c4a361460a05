"""Declared rollup tables: kept by reduce and the stream, equal to a rollup from scratch at every step.

One lake walks through batch days, a backfill that changes a day, the stream (then a batch combine
of a streamed day: the hybrid rule), and a ``kill -9`` between the ``aggregates`` commit and the
rollup's; every refresh merges on forked workers. After each step every declared rollup table must equal ``inspect rollup`` of the whole
range at its grain and keys (the ad-hoc merge, from scratch), its exact values must equal DuckDB
over the raw rows, and its app transaction must name the latest ``aggregates`` version.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from spark_jobs.errors import SpecChangedError, SpecError
from spark_jobs.inspection.rollup import Rollup, rollup
from spark_jobs.jobs import combine, reduce
from spark_jobs.jobs.apply import apply
from spark_jobs.lake import PipelineTables, time_chunks
from spark_jobs.lake.reader import open_table
from spark_jobs.lake.table_rules import rollup_app_id
from spark_jobs.quality import gate
from spark_jobs.spec import Duration, PipelineSpec, RollupSpec, parse_spec
from spark_jobs.stream import query as stream
from tests.builders import ALL_AGGREGATES, day_events, killed_at, make_spec, write_day
from tests.integration.test_rollup import assert_rollup, oracle
from tests.oracle import read_landing, valid_rows

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
ROLLUPS = [{"name": "daily", "grain": "1 day", "by": ["page"]},
           {"name": "six_hours", "grain": "6 hours", "by": ["page", "country"]},
           {"name": "weekly_total", "grain": "1 week", "by": []}]


def check(spec: PipelineSpec) -> None:
    """Every rollup table equals a from-scratch rollup and the oracle, at the latest aggregates version."""
    tables = PipelineTables(spec.lake, spec.name)
    aggregates = open_table(tables.aggregates)
    raw = valid_rows(read_landing(Path(spec.source.path)), spec).read_all()
    for declared in spec.rollups:
        table = open_table(tables.rollup(declared.name))
        assert table.transaction_version(rollup_app_id(spec, declared)) == aggregates.version()
        got = table.read().to_pandas()
        assert not got.duplicated([*declared.by, "window_start"]).any()
        assert (got["window_end"] - got["window_start"] == pd.Timedelta(seconds=declared.grain.seconds)).all()
        lo, hi = got["window_start"].min().to_pydatetime(), got["window_end"].max().to_pydatetime()
        request = Rollup(lo, hi, declared.by, declared.grain.seconds)
        scratch = rollup(aggregates, spec, request, declared=False).to_pandas()
        got = got.rename(columns={"window_start": "start"})
        assert_same(got, scratch, spec, declared.by)  # incremental == from scratch
        routed = rollup(aggregates, spec, request)  # inspect rollup reads the declared table when it tiles
        assert routed.schema.metadata[b"source"] == declared.table.encode()
        assert_same(routed.to_pandas(), scratch, spec, declared.by)
        assert_rollup(got, oracle(raw, spec, request), spec, declared.by)  # == DuckDB on the raw rows
        assert got["n_rows"].sum() == raw.num_rows


def assert_same(got: pd.DataFrame, scratch: pd.DataFrame, spec: PipelineSpec, by: tuple[str, ...]) -> None:
    """Equal values, but for KLL quantiles: DataSketches' KLL merge compacts at random (checked by the oracle)."""
    columns = [*by, "start", "n_rows", *(a.name for a in spec.aggregates if a.fn != "approx_percentile")]
    got, scratch = (f.sort_values([*by, "start"]).reset_index(drop=True)[columns] for f in (got, scratch))
    pd.testing.assert_frame_equal(got, scratch, check_dtype=False)


@pytest.fixture(scope="module", autouse=True)
def forked_merges():
    """Every refresh here merges its buckets on every core (forked workers), a bucket at a time, as a large one does
    (and a full reduce tells its change a day at a time)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time_chunks, "CHUNK_BYTES", 1)
        yield


@pytest.fixture(scope="module")
def spec(tmp_path_factory) -> PipelineSpec:
    root = tmp_path_factory.mktemp("rollup_tables")
    return make_spec(root, window={"size": "1 hour"}, group_by=["page", "country"], aggregates=ALL_AGGREGATES,
                     rollups=ROLLUPS)


def land(spec: PipelineSpec, day: str, seed: int, n: int = 600) -> None:
    write_day(Path(spec.source.path), day, day_events(day, n, seed=seed, rejected=2), files=2)


def test_batch_backfill_and_a_changed_day(spark, spec):
    for i, day in enumerate(("2024-03-04", "2024-03-05")):
        land(spec, day, i)
        combine.run(spark, spec, day)
    record = reduce.run(spark, spec)
    assert {"rollup_daily", "rollup_six_hours", "rollup_weekly_total"} <= set(record.versions_written)
    check(spec)
    land(spec, "2024-03-02", 7)  # a backfilled day in the week before
    combine.run(spark, spec, "2024-03-02")
    reduce.run(spark, spec)
    check(spec)
    daily = open_table(PipelineTables(spec.lake, spec.name).rollup("daily"))
    assert daily.history(1)[0].get("aggregates_consumed") is not None  # incremental, not rebuilt
    land(spec, "2024-03-04", 11, n=300)  # a day re-landed: its buckets shrink
    combine.run(spark, spec, "2024-03-04")
    reduce.run(spark, spec)
    check(spec)
    assert reduce.run(spark, spec).versions_written.get("rollup_daily") is None  # nothing new: no commit


def test_the_gate_checks_the_rollups(spark, spec):
    report = gate.validate(spark, spec, "outputs")
    mine = [c for c in report.checks if c.description.startswith("rollup_")]
    assert len(mine) >= 3 * len(spec.rollups) and all(c.success for c in mine)
    assert any("reconcile" in c.description for c in mine)


def test_the_cli_reads_the_daily_table_and_says_so(spec):
    argv = [sys.executable, "-m", "spark_jobs", "inspect", "rollup", f"{spec.name}.aggregates", "--pipeline",
            spec.origin, "--from", "2024-03-04", "--to", "2024-03-06", "--by", "page", "--grain", "1 day"]
    daily = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    hourly = subprocess.run([*argv[:-1], "3 hours"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert daily.returncode == hourly.returncode == 0, daily.stderr + hourly.stderr
    assert f"merged from {spec.name}.rollup_daily" in daily.stderr
    assert f"merged from {spec.name}.aggregates" in hourly.stderr  # no declared table has 3-hour buckets
    assert "/a" in daily.stdout and "2024-03-05" in daily.stdout


def test_the_stream_then_a_batch_day(spark, spec):
    land(spec, "2024-03-06", 21)  # a new day the stream picks up (the others are already in the checkpoint's
    stream.run(spark, spec, available_now=True)  # first batch: it counts them too, as streaming partials)
    check(spec)
    combine.run(spark, spec, "2024-03-06")  # the batch day supersedes the stream's partials of it
    reduce.run(spark, spec)
    check(spec)


def test_commits_that_change_no_rows_still_advance_the_rollups(spark, spec):
    """A file streamed into a batch day counts for nothing (the hybrid rule), yet the stream and reduce
    commit ``aggregates``: the rollups must record those versions, or they would look stale."""
    tables = PipelineTables(spec.lake, spec.name)
    def counts(r: RollupSpec) -> list[dict]:
        return open_table(tables.rollup(r.name)).read([*r.by, "window_start", "n_rows"]).sort_by(
            [(c, "ascending") for c in [*r.by, "window_start"]]).to_pylist()

    before = {r.name: counts(r) for r in spec.rollups}
    late = Path(spec.source.path) / "event_date=2024-03-06" / "late.parquet"
    pq.write_table(day_events("2024-03-06", 50, seed=99), late)
    try:
        stream.run(spark, spec, available_now=True)
        reduce.run(spark, spec)
        version = open_table(tables.aggregates).version()
        for r in spec.rollups:
            assert open_table(tables.rollup(r.name)).transaction_version(rollup_app_id(spec, r)) == version
            assert counts(r) == before[r.name]
    finally:
        late.unlink()


def test_a_kill_between_the_aggregates_and_rollup_commits(spark, spark_server, spec):
    land(spec, "2024-03-07", 31)
    combine.run(spark, spec, "2024-03-07")
    killed_at("commit:aggregates:after", "reduce", "--pipeline", spec.origin, remote=spark_server.remote)
    tables = PipelineTables(spec.lake, spec.name)
    behind = open_table(tables.rollup("daily")).transaction_version(rollup_app_id(spec, spec.rollups[0]))
    assert behind is not None and behind < open_table(tables.aggregates).version()
    aggregates = open_table(tables.aggregates)
    day = Rollup(dt.datetime(2024, 3, 7, tzinfo=dt.UTC), dt.datetime(2024, 3, 8, tzinfo=dt.UTC), ("page",), 86_400)
    assert rollup(aggregates, spec, day).schema.metadata[b"source"] == b"aggregates"  # a stale rollup is not read
    record = reduce.run(spark, spec)
    assert record.status == "noop" and record.versions_written["rollup_daily"] is not None
    check(spec)


def test_a_changed_declaration_is_refused_until_apply_rebuilds_the_table(spark, spec):
    two_days = dataclasses.replace(spec, rollups=(dataclasses.replace(spec.rollups[0], grain=Duration(2 * 86_400)),))
    with pytest.raises(SpecChangedError, match="plan"):
        reduce.run(spark, two_days)
    result = apply(two_days, spark=lambda: spark)  # from the stored accumulators, no landing file read
    assert result.version == 2
    check(two_days)


@pytest.mark.parametrize(("rollups", "message"), [
    ([{"name": "daily", "grain": "90 minutes"}], "not a whole number of 1 hour windows"),
    ([{"name": "daily", "grain": "1 day", "by": ["user_id"]}], "'user_id' is not a group key"),
    ([{"name": "Daily", "grain": "1 day"}], "bad name 'Daily'"),
    ([{"name": "d", "grain": "1 day"}, {"name": "d", "grain": "1 week"}], "declared twice"),
    ([{"name": "d", "grain": "soon"}], "bad duration 'soon'"),
    ({"name": "d"}, "expected a list"),
    ([{"name": "w", "grain": "1 week"}], None),  # with 1-week windows: they start on Thursdays
])
def test_bad_rollup_declarations_are_named(tmp_path, rollups, message):
    window = {"size": "1 week" if message is None else "1 hour"}
    message = message or "weekly buckets start on Monday, which cuts a 1 week window"
    raw = {"name": "views", "source": {"path": str(tmp_path), "event_time": "t",
                                       "schema": {"t": "timestamp", "page": "string", "user_id": "string"}},
           "group_by": ["page"], "window": window, "aggregates": [{"name": "n", "fn": "count"}],
           "rollups": rollups, "lake": str(tmp_path)}
    with pytest.raises(SpecError, match=message):
        parse_spec(raw)


def test_rollups_need_tumbling_windows(tmp_path):
    raw = {"name": "views", "source": {"path": str(tmp_path), "event_time": "t", "schema": {"t": "timestamp"}},
           "group_by": [], "window": {"size": "1 hour", "slide": "30 minutes"},
           "aggregates": [{"name": "n", "fn": "count"}], "rollups": [{"name": "d", "grain": "1 day"}],
           "lake": str(tmp_path)}
    with pytest.raises(SpecError, match="hopping windows overlap"):
        parse_spec(raw)
