"""Spec changes on a live lake: ``plan`` and ``apply``, against DuckDB on the raw rows at every step.

A lake keeps its spec (``specs``) and every row its ``spec_version``; an added aggregate is NULL in the
windows of days not recombined since, never a partial value; dropped aggregates and keys and coarser
windows are re-derived from the stored accumulators; jobs refuse a spec the lake has not applied; apply
is exactly once under ``kill -9`` and a writer racing it conflicts, then refuses.
"""

from __future__ import annotations

import copy
import datetime as dt
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake

from spark_jobs._failpoints import once_at
from spark_jobs.cli import main as cli
from spark_jobs.errors import SpecChangedError
from spark_jobs.jobs import combine, reduce
from spark_jobs.jobs.apply import apply
from spark_jobs.jobs.rollups import rollup_rows
from spark_jobs.lake import PipelineTables
from spark_jobs.lake.reader import open_table
from spark_jobs.lake.runs_table import read_runs
from spark_jobs.lake.spec_record import APPLIED, APPLYING, current, read_records, spec_app_id
from spark_jobs.lake.table_rules import rollup_app_id
from spark_jobs.phases import CompiledAggregates
from spark_jobs.spec import PipelineSpec, load_spec
from spark_jobs.spec_plan import make_plan
from spark_jobs.stream import query as stream
from tests.builders import ALL_AGGREGATES, FAST_AGGREGATES, day_events, write_day
from tests.integration.test_stream import land
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
D1, D2, D3, D4 = "2024-03-01", "2024-03-02", "2024-03-03", "2024-03-04"
P50 = {"name": "p50_ms", "fn": "approx_percentile", "column": "duration_ms", "args": {"q": 0.5}}


def write_spec(root: Path, raw: dict[str, Any]) -> PipelineSpec:
    """(Re)write the pipeline's spec file, as a user edits it, and load it."""
    path = root / "views.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_spec(path)


def base(root: Path, *, aggregates: list[dict[str, Any]] | None = None, group_by: list[str] | None = None,
         window: str | None = "1 hour", rollups: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "views",
        "source": {"path": str(root / "landing"), "format": "parquet", "event_time": "event_time",
                   "schema": {"event_time": "timestamp", "user_id": "string", "page": "string",
                              "duration_ms": "long", "weight": "double", "country": "string"}},
        "group_by": group_by or ["page"],
        "aggregates": copy.deepcopy(aggregates if aggregates is not None else FAST_AGGREGATES),
        "lake": str(root / "lake"),
    }
    if window:
        raw["window"] = {"size": window}
    if rollups:
        raw["rollups"] = rollups
    return raw


def land_days(root: Path, *days: str, n: int = 300) -> None:
    """Days of events with a country on every row (a dropped key then drops no rejected row)."""
    for i, day in enumerate(days):
        table = day_events(day, n, seed=i)
        table = table.set_column(5, "country", pc.fill_null(table.column("country"), "XX"))
        write_day(root / "landing", day, table, files=2)


def served(spec: PipelineSpec) -> pd.DataFrame:
    return actual(PipelineTables(spec.lake, spec.name).aggregates, spec)


def oracle(spec: PipelineSpec, days: list[str] | None = None) -> pd.DataFrame:
    raw = read_landing(spec.source.path)
    if days is not None:
        raw = raw.filter(pc.is_in(raw.column("event_date"), pa.array(days)))
    return expected(raw, spec)


def without(spec: PipelineSpec, *names: str) -> PipelineSpec:
    """The spec without some aggregates: what the oracle compares where those are NULL."""
    import dataclasses

    return dataclasses.replace(spec, aggregates=tuple(a for a in spec.aggregates if a.name not in names))


def day_of(frame: pd.DataFrame) -> pd.Series:
    return frame["window_start"].dt.strftime("%Y-%m-%d")


def test_a_metric_is_added_backfilled_dropped_and_the_windows_go_daily(spark, tmp_path):
    """The issue's walk: the sample's shape gains a metric, has it backfilled, loses one, moves to daily windows."""
    rollups = [{"name": "daily", "grain": "1 day", "by": ["page"]}]
    v1 = write_spec(tmp_path, base(tmp_path, aggregates=ALL_AGGREGATES, rollups=rollups))
    land_days(tmp_path, D1, D2, D3)
    for day in (D1, D2, D3):
        combine.run(spark, v1, day)
    reduce.run(spark, v1)
    assert_matches(served(v1), oracle(v1), v1)
    assert [(r.version, r.status) for r in read_records(v1.lake, v1.name)] == [(1, APPLIED)]

    # v2: a new metric. plan needs no Spark and lists the days; apply only adds columns
    v2 = write_spec(tmp_path, base(tmp_path, aggregates=[*ALL_AGGREGATES, P50], rollups=rollups))
    plan = make_plan(v2, read_records(v2.lake, v2.name))
    assert [c.kind for c in plan.diff.changes] == ["raw"] and [d.date for d in plan.days] == [D1, D2, D3]
    assert all(d.landing_rows == 300 for d in plan.days)
    assert f"airflow backfill create --dag-id views_batch --from-date {D1} --to-date {D3}" in plan.commands()
    before = served(v1)
    with pytest.raises(SpecChangedError, match=r"plan --pipeline .*apply --pipeline"):
        combine.run(spark, v2, D1)  # not applied yet: refused before any work
    result = apply(v2)
    assert result.engine == "arrow" and result.version == 2
    after = served(v2)
    assert after["p50_ms"].isna().all()  # NULL, never a partial value
    pd.testing.assert_frame_equal(after[before.columns.drop(["updated_at", "run_id"])],
                                  before[before.columns.drop(["updated_at", "run_id"])], check_dtype=False)
    with pytest.raises(SpecChangedError, match="differs from the spec the lake"):
        reduce.run(spark, v1)  # the old spec is refused now

    # recombining D1 fills its windows, and only them
    combine.run(spark, v2, D1)
    reduce.run(spark, v2)
    got = served(v2)
    assert got.loc[day_of(got) == D1, "p50_ms"].notna().all() and got.loc[day_of(got) != D1, "p50_ms"].isna().all()
    assert_matches(got, oracle(without(v2, "p50_ms")), without(v2, "p50_ms"))
    assert [d.date for d in make_plan(v2, read_records(v2.lake, v2.name)).days] == [D2, D3]
    rollup = DeltaTable(PipelineTables(v2.lake, v2.name).rollup("daily")).to_pandas()
    assert rollup.loc[day_of(rollup) == D1, "p50_ms"].notna().all() and rollup.loc[day_of(rollup) != D1, "p50_ms"].isna().all()

    combine.run(spark, v2, D2)
    combine.run(spark, v2, D3)
    reduce.run(spark, v2)
    assert_matches(served(v2), oracle(v2), v2)  # every column equals a from-scratch computation

    # v3: a metric dropped and the windows coarsened to days: from the stored accumulators, no raw data
    aggs = [a for a in [*ALL_AGGREGATES, P50] if a["name"] != "max_ms"]
    v3 = write_spec(tmp_path, base(tmp_path, aggregates=aggs, window="1 day", rollups=rollups))
    plan = make_plan(v3, read_records(v3.lake, v3.name))
    assert {c.kind for c in plan.diff.changes} == {"stored"} and plan.days == []
    apply(v3)
    assert_matches(served(v3), oracle(v3), v3)
    partials = DeltaTable(PipelineTables(v3.lake, v3.name).partials).schema().to_arrow()
    assert not [f.name for f in partials if f.name.startswith("max_ms")]
    rollup = DeltaTable(PipelineTables(v3.lake, v3.name).rollup("daily")).to_pandas()
    assert sorted(rollup["views"]) == sorted(served(v3)["views"])  # a day window is its own daily bucket

    land_days(tmp_path, D4)  # and the pipeline goes on, daily
    combine.run(spark, v3, D4)
    reduce.run(spark, v3)
    assert_matches(served(v3), oracle(v3), v3)
    assert [(r.version, r.status) for r in read_records(v3.lake, v3.name)][-2:] == [(3, APPLYING), (3, APPLIED)]


@pytest.fixture(scope="module")
def two_key_lake(spark, tmp_path_factory) -> Path:
    """Three batch days and a streamed fourth, grouped by page and country, hourly: copied by each test."""
    root = tmp_path_factory.mktemp("two_keys")
    spec = write_spec(root, base(root, aggregates=ALL_AGGREGATES, group_by=["page", "country"],
                                 rollups=[{"name": "daily", "grain": "1 day", "by": ["page"]}]))
    land_days(root, D1, D2, D3, D4)
    for day in (D1, D2, D3):
        combine.run(spark, spec, day)
    reduce.run(spark, spec)
    shutil.rmtree(root / "landing" / f"event_date={D4}")
    table = day_events(D4, 300, seed=9)
    land(root / "landing", D4, table.set_column(5, "country", pc.fill_null(table.column("country"), "XX")))
    stream.run(spark, spec, available_now=True)
    return root


def copy_lake(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    raw = yaml.safe_load((target / "views.yaml").read_text())
    raw["source"]["path"], raw["lake"] = str(target / "landing"), str(target / "lake")
    (target / "views.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return target


@pytest.mark.parametrize("engine", ["arrow", "spark"])
def test_a_dropped_key_and_daily_windows_are_derived_alike_in_arrow_and_spark(spark, two_key_lake, tmp_path, engine):
    root = copy_lake(two_key_lake, tmp_path / "lake_copy")
    raw = base(root, aggregates=ALL_AGGREGATES, group_by=["page"], window="1 day",
               rollups=[{"name": "daily", "grain": "1 day", "by": ["page"]}])
    spec = write_spec(root, raw)
    result = apply(spec, spark=lambda: spark, engine=engine)
    assert result.engine == engine
    assert_matches(served(spec), oracle(spec), spec)  # batch days and the streamed day, merged across country
    state = DeltaTable(PipelineTables(spec.lake, spec.name).stream_state).to_pandas()
    assert "country" not in state.columns and set(state["window_end"] - state["window_start"]) == {pd.Timedelta(days=1)}
    for path in (PipelineTables(spec.lake, spec.name).partials, PipelineTables(spec.lake, spec.name).aggregates):
        assert DeltaTable(path).transaction_version(spec_app_id(spec.name)) == 2
    combine.run(spark, spec, D2)  # a day recombined by the new spec joins the derived ones
    reduce.run(spark, spec)
    assert_matches(served(spec), oracle(spec), spec)


def test_a_rollup_whose_grain_and_keys_stand_keeps_its_rows_through_a_key_drop(spark, two_key_lake, tmp_path):
    """``rollup_daily`` (by page) merges the same events per page and day whatever ``aggregates`` is keyed by:
    apply keeps its files and records it as merged from the new ``aggregates``, so no refresh re-merges it."""
    root = copy_lake(two_key_lake, tmp_path / "lake_copy")
    old = load_spec(root / "views.yaml")
    reduce.run(spark, old)  # the streamed day reduced: the rollup has merged everything the partials hold
    tables = PipelineTables(old.lake, old.name)
    files = set(DeltaTable(tables.rollup("daily")).file_uris())
    spec = write_spec(root, base(root, aggregates=ALL_AGGREGATES, group_by=["page"],
                                 rollups=[{"name": "daily", "grain": "1 day", "by": ["page"]}]))
    apply(spec)
    rolled = DeltaTable(tables.rollup("daily"))
    assert set(rolled.file_uris()) == files
    assert rolled.transaction_version(rollup_app_id(spec, spec.rollups[0])) == DeltaTable(tables.aggregates).version()
    assert rolled.transaction_version(spec_app_id(spec.name)) == 2
    kept = rolled.to_pyarrow_table()
    rebuilt = rollup_rows(open_table(tables.aggregates), CompiledAggregates(spec, current(spec.lake, spec.name)),
                          spec.rollups[0], None, run_id="check")
    values = ["page", "window_start", "n_rows", *(a.name for a in spec.aggregates)]
    order = [("page", "ascending"), ("window_start", "ascending")]
    assert kept.select(values).sort_by(order).to_pylist() == rebuilt.select(values).sort_by(order).to_pylist()


def test_the_stream_resumes_across_a_coarsening_with_its_state_rebuilt(spark, tmp_path):
    """Hourly windows close behind the watermark and leave the state; after ``apply`` to daily windows the
    open day's state holds all of its hours again (from the stream's partials) and the stream goes on."""
    raw = base(tmp_path, aggregates=FAST_AGGREGATES, window="1 hour")
    raw["stream"] = {"max_files_per_batch": 1, "watermark": "10 minutes"}
    spec = write_spec(tmp_path, raw)
    day = day_events(D1, 400, seed=3).sort_by("event_time")
    morning = day.filter(pc.less(day.column("event_time"), pa.scalar(dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC))))
    evening = day.filter(pc.greater_equal(day.column("event_time"),
                                          pa.scalar(dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC))))
    land(tmp_path / "landing", D1, morning)
    land(tmp_path / "landing", D1, evening.slice(0, evening.num_rows - 20))
    stream.run(spark, spec, available_now=True)
    state = DeltaTable(PipelineTables(spec.lake, spec.name).stream_state).to_pandas()
    assert len(state.groupby("window_start")) <= 2  # the closed hours left the state

    raw["window"] = {"size": "1 day"}
    daily = write_spec(tmp_path, raw)
    apply(daily)
    state = DeltaTable(PipelineTables(daily.lake, daily.name).stream_state).to_pandas()
    assert set(state["window_start"].dt.strftime("%Y-%m-%d")) == {D1}
    assert state["n_rows"].sum() == day.num_rows - 20 - int(pc.sum(pc.is_null(day.column("page"))).as_py() or 0)

    land(tmp_path / "landing", D1, evening.slice(evening.num_rows - 20))  # the day's last rows, on time
    land(tmp_path / "landing", D2, day_events(D2, 100, seed=4))
    stream.run(spark, daily, available_now=True)
    assert_matches(served(daily), oracle(daily), daily)
    log = DeltaTable(PipelineTables(daily.lake, daily.name).changelog).to_pandas()
    assert {"-U", "+U"} <= set(log["op"])  # the open day window grew after the change


def test_a_key_added_drops_every_day_until_they_are_recombined(spark, two_key_lake, tmp_path):
    root = copy_lake(two_key_lake, tmp_path / "lake_copy")
    spec = write_spec(root, base(root, aggregates=ALL_AGGREGATES, group_by=["page", "country", "user_id"],
                                 rollups=[{"name": "daily", "grain": "1 day", "by": ["page"]}]))
    plan = make_plan(spec, read_records(spec.lake, spec.name))
    assert plan.diff.reset and [d.date for d in plan.days] == [D1, D2, D3, D4]
    apply(spec)
    assert served(spec).empty
    record = current(spec.lake, spec.name)
    assert record is not None and record.uncovered_through == dt.date(2024, 3, 4)
    assert [d.date for d in make_plan(spec, read_records(spec.lake, spec.name)).days] == [D1, D2, D3, D4]
    table = day_events(D4, 40, seed=11)  # a late file of a dropped day, streamed: served NULL, never partial
    land(root / "landing", D4, table.set_column(5, "country", pc.fill_null(table.column("country"), "XX")))
    stream.run(spark, spec, available_now=True)
    got = served(spec)
    assert len(got) and got[[a["name"] for a in ALL_AGGREGATES]].isna().all().all()
    for day in (D1, D2, D3, D4):
        combine.run(spark, spec, day)
    reduce.run(spark, spec)
    assert_matches(served(spec), oracle(spec), spec)
    assert make_plan(spec, read_records(spec.lake, spec.name)).days == []


def test_a_lake_from_before_spec_records_is_adopted_on_its_first_apply(spark, tmp_path):
    spec = write_spec(tmp_path, base(tmp_path))
    land_days(tmp_path, D1)
    combine.run(spark, spec, D1)
    reduce.run(spark, spec)
    tables = PipelineTables(spec.lake, spec.name)
    shutil.rmtree(tables.specs)  # as a lake written before spec records: no record, no spec_version
    for path in (tables.partials, tables.aggregates):  # written afresh: no spec_version, no app transactions
        old = DeltaTable(path)
        rows, parts = old.to_pyarrow_table().drop_columns(["spec_version"]), old.metadata().partition_columns
        shutil.rmtree(path)
        write_deltalake(path, rows, partition_by=list(parts) or None)
    with pytest.raises(SpecChangedError, match="written before lakes recorded their spec"):
        reduce.run(spark, spec)
    other = write_spec(tmp_path, base(tmp_path, window="1 day"))
    with pytest.raises(SpecChangedError, match="windows of 3600 s, the spec says 1 day"):
        apply(other)
    spec = write_spec(tmp_path, base(tmp_path))
    assert apply(spec).version == 1
    assert [(r.version, r.status) for r in read_records(spec.lake, spec.name)] == [(1, APPLYING), (1, APPLIED)]
    land_days(tmp_path, D2)
    combine.run(spark, spec, D2)
    reduce.run(spark, spec)
    assert_matches(served(spec), oracle(spec), spec)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["commit:specs:after", "commit:partials:after", "commit:aggregates:after",
                                   "commit:rollup_daily:before"])
def test_apply_killed_anywhere_then_rerun_gives_the_tables_of_one_apply(spark, two_key_lake, tmp_path, point):
    """``kill -9`` of ``python -m spark_jobs apply`` (no JVM: merges in Arrow) at a commit point: jobs refuse the
    half-applied lake, and a second apply finishes it with the tables of an uninterrupted one."""
    killed = copy_lake(two_key_lake, tmp_path / "killed")
    clean = copy_lake(two_key_lake, tmp_path / "clean")
    specs = {}
    for root in (killed, clean):
        specs[root] = write_spec(root, base(root, aggregates=[*ALL_AGGREGATES[:4], P50], group_by=["page"],
                                            window="1 day", rollups=[{"name": "daily", "grain": "1 day", "by": ["page"]}]))
    env = {**os.environ, "SPARK_JOBS_FAILPOINT": f"{point}@1"}
    proc = subprocess.run([sys.executable, "-m", "spark_jobs", "apply", "--pipeline", specs[killed].origin],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == -9, proc.stderr
    assert current(specs[killed].lake, "views").status == APPLYING  # type: ignore[union-attr]
    with pytest.raises(SpecChangedError, match="has not finished"):
        combine.run(spark, specs[killed], D1)
    env.pop("SPARK_JOBS_FAILPOINT")
    for root in (killed, clean):
        proc = subprocess.run([sys.executable, "-m", "spark_jobs", "apply", "--pipeline", specs[root].origin],
                              env=env, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr
    for table in ("aggregates", "partials", "rollup_daily", "_stream/state"):
        a, b = (DeltaTable(str(root / "lake" / "views" / table)).to_pandas() for root in (killed, clean))
        drop = [c for c in ("updated_at", "run_id", "created_at") if c in a.columns]
        keys = [c for c in ("batch", "event_date", "page", "window_start") if c in a.columns]
        a, b = (f.drop(columns=drop).sort_values(keys).reset_index(drop=True) for f in (a, b))
        sketches = [c for c in a.columns if c.endswith(("__hll", "__kll"))]
        pd.testing.assert_frame_equal(a.drop(columns=sketches), b.drop(columns=sketches), check_dtype=False)
    assert_matches(served(specs[killed]), oracle(without(specs[killed], "p50_ms")), without(specs[killed], "p50_ms"))


def test_a_reduce_racing_apply_conflicts_then_refuses_and_leaves_one_layout(spark, tmp_path):
    v1 = write_spec(tmp_path, base(tmp_path))
    land_days(tmp_path, D1, D2)
    combine.run(spark, v1, D1)
    reduce.run(spark, v1)
    combine.run(spark, v1, D2)
    v2_raw = base(tmp_path, window="1 day")
    v2_path = tmp_path / "v2.yaml"
    v2_path.write_text(yaml.safe_dump(v2_raw))
    v2 = load_spec(v2_path)
    with once_at("commit:aggregates:before", lambda: apply(v2)), pytest.raises(SpecChangedError, match="differs"):
        reduce.run(spark, v1)  # its commit loses to apply's; its retry finds the spec changed
    aggregates = served(v2)
    assert set(aggregates["window_end"] - aggregates["window_start"]) == {pd.Timedelta(days=1)}
    assert_matches(aggregates, oracle(v2, [D1, D2]), v2)  # apply reduced the day the reduce had not


def test_plan_and_jobs_on_the_command_line(spark, tmp_path, capsys):
    spec = write_spec(tmp_path, base(tmp_path, rollups=[{"name": "daily", "grain": "1 day"}]))
    assert cli(["plan", "--pipeline", spec.origin]) == 0  # a new lake: the tables it would create, no JVM
    out = capsys.readouterr().out
    assert "no lake at" in out and "aggregates: page, window_start, window_end, views" in out
    land_days(tmp_path, D1)
    assert cli(["run", "--pipeline", spec.origin, "--from", D1, "--to", D1, "--run-id", "first-day"]) == 0
    runs = {(r["job"], r["run_id"]) for r in read_runs(PipelineTables(spec.lake, spec.name).runs)}
    assert {("combine", "first-day"), ("reduce", "first-day-reduce")} <= runs  # --run-id is honoured
    changed = write_spec(tmp_path, base(tmp_path, aggregates=[*FAST_AGGREGATES, P50],
                                        rollups=[{"name": "daily", "grain": "1 day"}]))
    capsys.readouterr()
    assert cli(["reduce", "--pipeline", changed.origin]) == 2  # refused before Spark starts
    err = capsys.readouterr().err
    assert "differs from the spec the lake" in err and "plan --pipeline" in err and "apply --pipeline" in err
    assert cli(["plan", "--pipeline", changed.origin, "--json"]) == 0
    import json

    plan = json.loads(capsys.readouterr().out)
    assert plan["changes"][0]["kind"] == "raw" and plan["recombine"][0]["date"] == D1
    assert cli(["apply", "--pipeline", changed.origin]) == 0
    capsys.readouterr()
    # inspect works from the lake alone: by pipeline name, no spec file
    lake = str(tmp_path / "lake")
    assert cli(["inspect", "coverage", "views", "--lake", lake, "--json"]) == 0
    coverage = {r["aggregate"]: r for r in json.loads(capsys.readouterr().out)}
    assert coverage["p50_ms"]["since_version"] == 2 and coverage["p50_ms"]["uncovered"] == D1
    assert coverage["views"]["covered"] == D1
    assert cli(["inspect", "rollup", "views.aggregates", "--lake", lake, "--from", D1, "--to", D2, "--by", ""]) == 0
    captured = capsys.readouterr()
    assert "300" in captured.out  # the rollup spec from the lake record: no spec file given
    assert cli(["inspect", "spec", "views", "--lake", lake, "--json"]) == 0
    steps = json.loads(capsys.readouterr().out)
    assert [(s["version"], s["status"]) for s in steps] == [(1, APPLIED), (2, APPLYING), (2, APPLIED)]
    assert steps[-1]["changes"].startswith("aggregate added: p50_ms")
    assert cli(["inspect", "tables", changed.origin, "--json"]) == 0  # a spec file as the PIPELINE argument
    assert {r["table"] for r in json.loads(capsys.readouterr().out)} >= {"views.aggregates", "views.specs"}
