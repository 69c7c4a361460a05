"""CUMULATE windows (Flink's ``CUMULATE(step, size)``) built as slices: batch, stream, changelog, plan/apply,
rollups and explain, against DuckDB over the raw rows."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs.durations import Duration
from spark_jobs.inspection.rollup import Rollup, rollup
from spark_jobs.jobs import combine, reduce
from spark_jobs.jobs.apply import apply
from spark_jobs.lake import PipelineTables
from spark_jobs.lake.reader import open_table
from spark_jobs.lake.spec_record import read_records
from spark_jobs.phases import CompiledAggregates
from spark_jobs.phases.explain import explain
from spark_jobs.spec import PipelineSpec, load_spec
from spark_jobs.spec_plan import make_plan
from spark_jobs.stream import run as stream
from spark_jobs.windows import Cumulative
from tests.builders import FAST_AGGREGATES, day_events, events, make_spec, write_day
from tests.integration.test_stream import land_sliced, with_stream
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

D1, D2 = "2024-03-01", "2024-03-02"
T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
DAILY = {"size": "1 day", "step": "6 hours"}
WINDOW = Cumulative(Duration(86_400), Duration(21_600))


def served(spec: PipelineSpec) -> Any:
    return actual(PipelineTables(spec.lake, spec.name).aggregates, spec)


def oracle(spec: PipelineSpec) -> Any:
    return expected(read_landing(spec.source.path), spec)


def test_a_day_of_windows_grows_slice_by_slice_as_the_oracle_counts_them(spark, tmp_path):
    spec = make_spec(tmp_path, window=DAILY, aggregates=FAST_AGGREGATES)
    for day, seed in ((D1, 1), (D2, 2)):
        write_day(tmp_path / "landing", day, day_events(day, 400, seed=seed), files=2)
        combine.run(spark, spec, day)
    reduce.run(spark, spec)
    got = served(spec)
    assert_matches(got, oracle(spec), spec)
    spans = sorted({(r.window_end - r.window_start).total_seconds() / 3600 for r in got.itertuples()})
    assert spans == [6, 12, 18, 24]  # four windows a day, each from midnight
    partials = DeltaTable(PipelineTables(spec.lake, spec.name).partials).to_pyarrow_table()
    slices = pc.subtract(partials.column("window_end"), partials.column("window_start")).cast(pa.int64())
    assert set(slices.to_pylist()) == {6 * 3600 * 1_000_000}  # partials hold the slices, once each

    write_day(tmp_path / "landing", D1, day_events(D1, 250, seed=9), files=1)  # a backfill of the first day
    shutil.rmtree(tmp_path / "landing" / f"event_date={D2}")
    write_day(tmp_path / "landing", D2, day_events(D2, 120, seed=3), files=1)
    for day in (D1, D2):
        combine.run(spark, spec, day)
    reduce.run(spark, spec)  # re-merges only the buckets the changed slices are in
    assert_matches(served(spec), oracle(spec), spec)


def test_the_stream_and_a_later_batch_give_the_oracle_and_the_changelog_folds_into_aggregates(spark, tmp_path):
    spec = with_stream(make_spec(tmp_path, window=DAILY, aggregates=FAST_AGGREGATES), max_files_per_batch=1,
                       watermark="1 day")
    land_sliced(tmp_path / "landing", D1, day_events(D1, 300, seed=4), files=3)
    summary = stream(spark, spec, available_now=True)
    assert len(summary.batches) == 3 and all(b.on_driver for b in summary.batches)
    assert_matches(served(spec), oracle(spec), spec)
    assert _folded(spec) == _served_values(spec)

    (tmp_path / "spark").mkdir()
    by_spark = with_stream(make_spec(tmp_path / "spark", window=DAILY, aggregates=FAST_AGGREGATES),
                           max_files_per_batch=1, watermark="1 day").with_paths(source_path=spec.source.path)
    assert not any(b.on_driver for b in stream(spark, by_spark, available_now=True, driver_max_keys=0).batches)
    assert_matches(served(by_spark), oracle(by_spark), by_spark)
    assert _folded(by_spark) == _folded(spec)  # the engines tell the same changes

    combine.run(spark, spec, D1)  # the day's batch supersedes the stream
    reduce.run(spark, spec)
    assert_matches(served(spec), oracle(spec), spec)


def _served_values(spec: PipelineSpec) -> dict[tuple[Any, ...], int]:
    rows = DeltaTable(PipelineTables(spec.lake, spec.name).aggregates).to_pyarrow_table().to_pylist()
    return {(r["page"], r["window_start"], r["window_end"]): r["views"] for r in rows}


def _folded(spec: PipelineSpec) -> dict[tuple[Any, ...], int]:
    """The changelog folded in order: +I/+U set a row's values, -U/-D take them away."""
    log = DeltaTable(PipelineTables(spec.lake, spec.name).changelog).to_pyarrow_table()
    out: dict[tuple[Any, ...], int] = {}
    for r in log.sort_by([("batch_id", "ascending"), ("seq", "ascending")]).to_pylist():
        key = (r["page"], r["window_start"], r["window_end"])
        if r["op"] in ("+I", "+U"):
            out[key] = r["views"]
        else:
            assert out.pop(key) == r["views"], r
    return out


def test_plan_sorts_window_changes_by_what_the_slices_can_derive(spark, tmp_path):
    hourly = make_spec(tmp_path, window={"size": "1 hour"}, aggregates=FAST_AGGREGATES,
                       rollups=[{"name": "daily", "grain": "1 day", "by": ["page"]}])
    for day, seed in ((D1, 1), (D2, 2)):
        write_day(tmp_path / "landing", day, day_events(day, 300, seed=seed))
        combine.run(spark, hourly, day)
    reduce.run(spark, hourly)

    def changed(window: dict[str, str]) -> PipelineSpec:
        raw = yaml.safe_load(Path(hourly.origin).read_text())
        raw["window"] = window
        Path(hourly.origin).write_text(yaml.safe_dump(raw))
        return load_spec(hourly.origin)

    cumulative = changed({"size": "1 day", "step": "1 hour"})  # the hourly windows are its slices: no raw data
    plan = make_plan(cumulative, read_records(cumulative.lake, cumulative.name))
    assert {c.kind for c in plan.diff.changes} == {"stored"} and plan.days == []
    apply(cumulative)
    assert_matches(served(cumulative), oracle(cumulative), cumulative)

    coarser = changed(DAILY)  # 1-hour slices merge into 6-hour ones
    plan = make_plan(coarser, read_records(coarser.lake, coarser.name))
    assert {c.kind for c in plan.diff.changes} == {"stored"} and plan.diff.coarsened
    apply(coarser)
    assert_matches(served(coarser), oracle(coarser), coarser)

    finer = changed({"size": "1 day", "step": "2 hours"})  # 6-hour slices do not tile 2-hour ones
    plan = make_plan(finer, read_records(finer.lake, finer.name))
    assert [c.kind for c in plan.diff.changes] == ["raw"] and [d.date for d in plan.days] == [D1, D2]


def test_rollups_and_inspect_rollup_merge_each_buckets_complete_window(spark, tmp_path):
    spec = make_spec(tmp_path, window=DAILY, aggregates=FAST_AGGREGATES,
                     rollups=[{"name": "days", "grain": "1 day", "by": []}])
    for day, seed in ((D1, 1), (D2, 2)):
        write_day(tmp_path / "landing", day, day_events(day, 200, seed=seed))
        combine.run(spark, spec, day)
    reduce.run(spark, spec)
    raw = read_landing(tmp_path / "landing")
    table = open_table(PipelineTables(spec.lake, spec.name).aggregates)
    by_day = rollup(table, spec, Rollup(T0, T0 + dt.timedelta(days=2), ("page",), 86_400), declared=False)
    for r in by_day.to_pylist():
        day = r["start"].date().isoformat()
        want = sum(1 for e in raw.to_pylist() if e["event_date"] == day and e["page"] == r["page"])
        assert r["views"] == want
    days = DeltaTable(PipelineTables(spec.lake, spec.name).rollup("days")).to_pyarrow_table().sort_by("window_start")
    assert days.column("views").to_pylist() == [200, 200]  # each day's complete window, not its 4 windows' sum
    with pytest.raises(Exception, match="not a whole number of 1 day windows"):
        rollup(table, spec, Rollup(T0, T0 + dt.timedelta(days=1), ("page",), 3600), declared=False)


def test_explain_says_how_slices_merge(spark, tmp_path):
    spec = make_spec(tmp_path, window=DAILY, aggregates=FAST_AGGREGATES)
    text = explain(spark, CompiledAggregates(spec), "reduce")
    assert "each window [bucket start, bucket start + k * 6 hours) of a 1 day bucket merges" in text


slices = st.lists(st.tuples(st.sampled_from(["/a", "/b"]), st.integers(0, 11), st.integers(1, 5)), max_size=12)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=slices, other=slices, hours=st.integers(0, 72))
def test_the_spark_and_arrow_forms_of_each_question_agree(spark, rows, other, hours):
    """serve, touched, within and is_open, as Spark answers them and as the driver does."""
    def table(items: list[tuple[str, int, int]]) -> pa.Table:
        start = [T0 + dt.timedelta(hours=6 * i) for _, i, _ in items]
        ts = pa.timestamp("us", "UTC")
        return pa.table({"page": pa.array([p for p, _, _ in items], pa.string()), "window_start": pa.array(start, ts),
                         "window_end": pa.array([s + dt.timedelta(hours=6) for s in start], ts),
                         "n_rows": pa.array([n for _, _, n in items], pa.int64())})

    stored, changed = table(rows), table(other)
    frames = [spark.createDataFrame(t) if t.num_rows else spark.createDataFrame([], spark.createDataFrame(
        table([("/a", 0, 1)])).schema) for t in (stored, changed)]
    watermark = T0 + dt.timedelta(hours=hours)

    def same(by_spark: Any, by_arrow: pa.Table) -> None:
        names = by_arrow.column_names
        assert sorted(by_spark.toArrow().select(names).cast(by_arrow.schema).to_pylist(), key=repr) == \
            sorted(by_arrow.to_pylist(), key=repr)

    same(WINDOW.serve(frames[0], ["page"]), WINDOW.serve_arrow(stored, ["page"]))
    same(WINDOW.touched(frames[1], ["page"]), WINDOW.touched_arrow(changed, ["page"]))
    same(WINDOW.within(frames[0], frames[1], ["page"]), WINDOW.within_arrow(stored, changed, ["page"]))
    same(frames[0].where(WINDOW.is_open(watermark)), stored.filter(WINDOW.is_open_arrow(stored, watermark)))


def test_a_late_slice_of_an_open_bucket_is_counted_and_a_closed_one_leaves_state(spark, tmp_path):
    spec = with_stream(make_spec(tmp_path, window=DAILY, aggregates=FAST_AGGREGATES), max_files_per_batch=1,
                       watermark="2 hours")
    landing = tmp_path / "landing"
    write_day(landing, D1, events([(T0 + dt.timedelta(hours=h), "u", "/a", 1, 1.0, "DE") for h in (1, 20)]))
    stream(spark, spec, available_now=True)
    write_day(landing, D2, events([(T0 + dt.timedelta(days=1, hours=3), "u", "/a", 1, 1.0, "DE")]))
    stream(spark, spec, available_now=True)
    state = DeltaTable(PipelineTables(spec.lake, spec.name).stream_state).to_pyarrow_table()
    assert {r["window_start"].date().isoformat() for r in state.to_pylist()} == {D2}  # day 1's bucket closed
    got = {(r["window_start"], r["window_end"]): r["views"] for r in served(spec).to_dict("records")}
    day1 = T0
    assert got[(day1, day1 + dt.timedelta(hours=6))] == 1 and got[(day1, day1 + dt.timedelta(days=1))] == 2
