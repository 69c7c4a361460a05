"""The Great Expectations gates on small data: what passes, what fails, what the report and lake show."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark_jobs.__main__ import main
from spark_jobs.errors import QualityError, SpecError
from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables
from spark_jobs.quality.gate import validate
from spark_jobs.quality.thresholds import load_rules
from tests.builders import FAST_AGGREGATES, day_events, events, make_spec, write_day

pytestmark = pytest.mark.spark

D1, D2 = "2024-03-01", "2024-03-02"
RULES = """
input:
  max_rejected_fraction: 0.05
  ranges: {duration_ms: {min: 0, max: 100000}}
outputs:
  ranges: {views: {min: 1}, max_ms: {min: 0, max: 100000}}
"""


@pytest.fixture
def spec(tmp_path):
    spec = make_spec(tmp_path, window={"size": "1 hour"}, aggregates=FAST_AGGREGATES)
    (tmp_path / "expectations").mkdir()
    (tmp_path / "expectations" / "views.yaml").write_text(RULES)
    return spec


def dead(spec, day: str) -> list[dict]:
    path = PipelineTables(spec.lake, spec.name).dead_letter
    if not DeltaTable.is_deltatable(path):
        return []
    return [d for d in DeltaTable(path).to_pyarrow_table().to_pylist() if d["batch"] == day and d["job"] == "validate"]


def test_good_input_passes_and_writes_a_readable_report(spark, spec, tmp_path):
    write_day(tmp_path / "landing", D1, day_events(D1, 300, rejected=2))
    report = validate(spark, spec, "input", date=D1)
    assert report.success and report.rows == 302 and report.dead_lettered == 0
    text = Path(report.report_path).with_suffix(".txt").read_text()
    assert text.splitlines()[0] == (f"views input suite for {D1}: PASSED ({len(report.checks)}/{len(report.checks)} "
                                    f"expectations met) on {tmp_path}/landing/event_date={D1}")
    assert "ok   range: duration_ms within [0, 100000]" in text
    assert "ok   parse: at most 5.00% of rows unreadable or invalid (they go to dead_letter): 2 unexpected" in text
    body = json.loads(Path(report.report_path).read_text())
    assert body["success"] and {c["expectation"] for c in body["checks"]} >= {
        "expect_column_to_exist", "expect_table_row_count_to_be_between", "expect_column_values_to_be_null",
        "expect_column_values_to_not_be_null", "expect_column_values_to_be_in_set",
        "expect_column_values_to_be_between"}
    assert dead(spec, D1) == []


def test_negative_durations_fail_the_gate_and_go_to_dead_letter(spark, spec, tmp_path):
    at = dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
    rows = [(at, "u1", "/a", 10, 1.0, "DE"), (at, "u2", "/a", -5, 1.0, "DE"), (at, "u3", "/b", 20, 1.0, "US")]
    write_day(tmp_path / "landing", D1, events(rows))
    with pytest.raises(QualityError, match=r"views input suite failed for 2024-03-01: range: duration_ms within "
                                           r"\[0, 100000\]\. Full report: .*/_quality/input/2024-03-01/") as info:
        validate(spark, spec, "input", date=D1)
    assert "FAIL range: duration_ms within [0, 100000]: 1 unexpected (33.33%), e.g. [-5]" in str(info.value)
    [row] = dead(spec, D1)
    assert row["reason"] == "quality gate: duration_ms -5 outside [0, 100000]"
    assert json.loads(row["raw"])["user_id"] == "u2"
    assert not DeltaTable.is_deltatable(PipelineTables(spec.lake, spec.name).partials)  # nothing combined


def test_a_missing_column_fails_the_schema_checks_and_dead_letters_every_row(spark, spec, tmp_path):
    write_day(tmp_path / "landing", D1, day_events(D1, 20).drop_columns(["country"]))
    with pytest.raises(QualityError, match=r"schema: source\.schema declares country"):
        validate(spark, spec, "input", date=D1)
    rows = dead(spec, D1)
    assert len(rows) == 20 and all("lacks columns ['country']" in r["reason"] for r in rows)


def test_events_of_another_day_fail_freshness(spark, spec, tmp_path):
    write_day(tmp_path / "landing", D1, day_events(D2, 50))  # yesterday's folder, today's events
    with pytest.raises(QualityError, match="freshness: event times fall on the partition's day 2024-03-01"):
        validate(spark, spec, "input", date=D1)
    assert len(dead(spec, D1)) == 50


def test_a_passing_rerun_clears_the_gates_rejects_of_that_day(spark, spec, tmp_path):
    write_day(tmp_path / "landing", D1, day_events(D1, 40, rejected=20))
    with pytest.raises(QualityError):
        validate(spark, spec, "input", date=D1)
    assert len(dead(spec, D1)) == 20
    write_day(tmp_path / "landing", D1, day_events(D1, 40))  # the fixed files
    assert validate(spark, spec, "input", date=D1).success
    assert dead(spec, D1) == []


def test_outputs_before_and_after_reduce_reconcile_with_runs_and_partials(spark, spec, tmp_path):
    for day in (D1, D2):
        write_day(tmp_path / "landing", day, day_events(day, 200, rejected=3))
        combine.run(spark, spec, day)
    before = validate(spark, spec, "outputs", date=D1)
    assert before.success
    recon = [c for c in before.checks if c.expectation == "expect_column_sum_to_be_between"]
    assert [c.description for c in recon] == ["reconcile: sum(n_rows) equals rows aggregated by the 2024-03-01 "
                                              "combine run (200)"]
    reduce.run(spark, spec)
    after = validate(spark, spec, "outputs")
    assert after.success, after.text()
    recon = [(c.description, c.observed) for c in after.checks if c.expectation == "expect_column_sum_to_be_between"]
    assert recon == [("reconcile: sum(n_rows) equals n_rows of the partials merged (version 1) (400)", 400.0),
                     ("reconcile: sum(n_rows) equals rows aggregated by the latest combine runs of 2 days (400)",
                      400.0)]


def test_outputs_out_of_bounds_fail_before_reduce_and_roll_the_day_back(spark, spec, tmp_path):
    tables = PipelineTables(spec.lake, spec.name)
    for day in (D1, D2):
        write_day(tmp_path / "landing", day, day_events(day, 50, seed=1))
        combine.run(spark, spec, day)
    reduce.run(spark, spec)
    served = DeltaTable(tables.aggregates).to_pandas().drop(columns=["updated_at", "run_id"])
    # D1 again, now with a duration the outputs gate bounds (max_ms <= 100000) reject
    at = dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
    write_day(tmp_path / "landing", D1, events([(at, "u1", "/a", 10, 1.0, "DE"), (at, "u2", "/a", 500_000, 1.0, "DE")]))
    combine.run(spark, spec, D1)  # no input gate here: the outputs gate must catch it
    with pytest.raises(QualityError, match=r"range: max_ms within \[0, 100000\]") as info:
        validate(spark, spec, "outputs", date=D1)
    assert "2024-03-01's partials rolled back to what aggregates holds (50 rows)" in str(info.value)
    # the next reduce (another day's run) does not publish the rejected day: the serving table is unchanged
    reduce.run(spark, spec)
    after = DeltaTable(tables.aggregates).to_pandas().drop(columns=["updated_at", "run_id"])
    keys = ["page", "window_start"]
    assert after.sort_values(keys).reset_index(drop=True).equals(served.sort_values(keys).reset_index(drop=True))
    assert validate(spark, spec, "outputs").success  # runs reconcile: the rollback is on record


def test_a_day_never_reduced_is_rolled_back_to_nothing(spark, spec, tmp_path):
    (tmp_path / "expectations" / "views.yaml").write_text("outputs:\n  ranges: {max_ms: {max: 5}}\n")
    write_day(tmp_path / "landing", D1, day_events(D1, 50))
    combine.run(spark, spec, D1)
    with pytest.raises(QualityError, match="range: max_ms within"):
        validate(spark, spec, "outputs", date=D1)
    tables = PipelineTables(spec.lake, spec.name)
    assert not DeltaTable.is_deltatable(tables.aggregates)
    assert DeltaTable(tables.partials).to_pyarrow_table().num_rows == 0


def test_the_cli_exits_5_on_a_failed_gate_and_2_on_a_bad_suite(spark, spec, tmp_path, capsys):
    write_day(tmp_path / "landing", D1, day_events(D1, 10, rejected=10))
    assert main(["validate", "--pipeline", spec.origin, "--suite", "input", "--date", D1]) == 5
    assert "error: views input suite failed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["validate", "--pipeline", spec.origin, "--suite", "everything"])
    assert info.value.code == 2


def test_bad_rules_name_the_field_and_the_fix(tmp_path):
    (tmp_path / "expectations").mkdir()
    (tmp_path / "expectations" / "p.yaml").write_text(
        "input: {max_rejected_fraction: 2, ranges: {x: {min: 5, max: 1}}}\noutput: {}\n")
    with pytest.raises(SpecError) as info:
        load_rules(tmp_path / "p.yaml", "p")
    assert info.value.problems == [
        "['output']: unknown sections; allowed are input, outputs",
        "input.max_rejected_fraction: 2.0 is not in [0, 1)",
        "input.ranges.x: min 5 is above max 1; swap them",
    ]
    assert load_rules(tmp_path / "q.yaml", "q").max_rejected_fraction == 0.01  # no file: defaults


def test_the_outputs_gate_holds_an_added_aggregate_to_null_where_the_partials_predate_it(spark, spec, tmp_path):
    from deltalake import write_deltalake

    from spark_jobs.jobs.apply import apply

    write_day(tmp_path / "landing", D1, day_events(D1, 120, seed=2))
    combine.run(spark, spec, D1)
    reduce.run(spark, spec)
    added = make_spec(tmp_path, window={"size": "1 hour"},
                      aggregates=[*FAST_AGGREGATES, {"name": "low_ms", "fn": "min", "column": "duration_ms"}])
    apply(added)
    report = validate(spark, added, "outputs")
    coverage = [c for c in report.checks if c.description.startswith("coverage: low_ms")]
    assert report.success and len(coverage) == 1 and coverage[0].success
    path = PipelineTables(added.lake, added.name).aggregates  # a partial value leaks into an old window
    rows = DeltaTable(path).to_pyarrow_table()
    leaked = rows.set_column(rows.schema.get_field_index("low_ms"), "low_ms",
                             pa.array([1] * rows.num_rows, rows.schema.field("low_ms").type))
    write_deltalake(path, leaked, mode="overwrite")
    with pytest.raises(QualityError, match=r"coverage: low_ms \(since spec version 2\) is NULL"):
        validate(spark, added, "outputs")
