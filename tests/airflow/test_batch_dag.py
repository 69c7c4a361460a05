"""The batch DAG under real Airflow 3: ``airflow dags test``, a scheduler backfill, a failed gate.

Real Spark (each task a client of the session's Spark Connect server, run in its warm runner, as
``bin/demo`` and a deployment run them; ``test_operators`` covers the spark-submit path), real
Delta, real Great Expectations; the DuckDB oracle (``tests/oracle.py``) says what ``aggregates``
must hold.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from spark_jobs.lake import PipelineTables
from tests.airflow.harness import airflow_home, running_airflow, wait_for_runs
from tests.builders import FAST_AGGREGATES, day_events, make_spec, write_day
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.slow

DAYS = ("2024-03-01", "2024-03-02")  # a backfill of two runs at once


def setup(tmp_path: Path, server, days: tuple[str, ...] = DAYS, rows: int = 1500, **spec_args):
    spec = make_spec(tmp_path, **{"window": {"size": "1 hour"}, "aggregates": FAST_AGGREGATES, **spec_args})
    for i, day in enumerate(days):
        write_day(tmp_path / "landing", day, day_events(day, rows, seed=i, rejected=4), files=2)
    return spec, PipelineTables(spec.lake, spec.name), airflow_home(tmp_path, tmp_path, server)


def create_backfill(af) -> None:
    """The backfill's runs of ``DAYS``, two at once. Created before the scheduler writes to SQLite ("database is
    locked"), with the DAG paused, so that no task starts before the API server its task processes report to is up."""
    af.run("dags", "reserialize")
    af.run("dags", "pause", "views_batch")
    af.run("backfill", "create", "--dag-id", "views_batch", "--from-date", DAYS[0], "--to-date", DAYS[-1],
           "--max-active-runs", "2")


def test_dags_test_of_one_day_produces_the_oracle_tables_and_quality_reports(spark_server, tmp_path):
    spec, tables, af = setup(tmp_path, spark_server, DAYS[:1])
    af.run("dags", "test", "views_batch", DAYS[0], timeout=900)
    [run] = af.runs("views_batch")
    states = af.task_states("views_batch", run["run_id"])
    assert run["state"] == "success", states
    assert set(states.values()) == {"success"}
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(tmp_path / "landing"), spec), spec)
    quality = Path(spec.lake) / "views" / "_quality"
    for suite, day in (("input", DAYS[0]), ("outputs", DAYS[0]), ("outputs", "all")):
        report = json.loads((quality / suite / day / "latest.json").read_text())
        assert report["success"] is True, report
    text = (quality / "input" / DAYS[0] / "latest.txt").read_text()
    assert text.startswith(f"views input suite for {DAYS[0]}: PASSED")
    assert "ok   parse: at most 1.00% of rows unreadable or invalid" in text
    dead = DeltaTable(tables.dead_letter).to_pyarrow_table().to_pylist()
    assert len(dead) == 4 and {d["job"] for d in dead} == {"combine"}  # row-level rejects, as always


def test_bad_input_fails_the_gate_leaves_aggregates_unchanged_and_dead_letters_the_rows(spark, spark_server, tmp_path):
    from spark_jobs.jobs import combine, reduce

    spec, tables, af = setup(tmp_path, spark_server, DAYS[:1])
    combine.run(spark, spec, DAYS[0])
    reduce.run(spark, spec)
    before = DeltaTable(tables.aggregates)
    version, files = before.version(), sorted(before.file_uris())
    partials_version = DeltaTable(tables.partials).version()
    # day 2: a third of the rows lack their event time: far above the 1% the gate allows
    write_day(tmp_path / "landing", DAYS[1], day_events(DAYS[1], 200, seed=9, rejected=100))
    proc = af.run("dags", "test", "views_batch", DAYS[1], timeout=900, check=False)
    [run] = af.runs("views_batch")
    states = af.task_states("views_batch", run["run_id"])
    assert run["state"] == "failed", proc.stdout[-3000:]
    assert states["wait_for_landing"] == "success"
    assert states["validate_input"] == "failed"
    assert {states[t] for t in ("combine", "validate_partials", "reduce", "validate_outputs", "publish")} == \
        {"upstream_failed"}
    after = DeltaTable(tables.aggregates)
    assert after.version() == version and sorted(after.file_uris()) == files  # the serving table is untouched
    assert DeltaTable(tables.partials).version() == partials_version
    dead = [d for d in DeltaTable(tables.dead_letter).to_pyarrow_table().to_pylist() if d["batch"] == DAYS[1]]
    assert len(dead) == 100 and {d["job"] for d in dead} == {"validate"}
    assert {d["reason"] for d in dead} == {"event_time is missing"}
    assert all(json.loads(d["raw"]).get("event_time") is None for d in dead)  # to_json leaves NULLs out
    report = json.loads((Path(spec.lake) / "views" / "_quality" / "input" / DAYS[1] / "latest.json").read_text())
    assert report["success"] is False and report["dead_lettered"] == 100
    failed = {c["description"] for c in report["checks"] if not c["success"]}
    assert "event time event_time present (at most 1.00% missing)" in failed
    runs = DeltaTable(tables.runs).to_pyarrow_table().to_pylist()
    [gate] = [r for r in runs if r["job"] == "validate" and r["batch"] == DAYS[1]]
    assert gate["status"] == "failed" and gate["message"].startswith("QualityError: views input suite failed")


@pytest.mark.timeout(1200)  # about two minutes on a quiet machine; the bound is for a loaded one
def test_a_scheduler_backfill_of_sessions_beside_a_stream_run_queues_the_writers_and_matches_the_oracle(
        spark_server, tmp_path):
    """Sessions per user over two days, backfilled at once while the stream DAG runs: each day's combine cuts
    partial sessions, each reduce merges the ones in reach, the gates pass, DuckDB agrees; the writers of
    ``aggregates`` in both DAGs (the batch reduces, the stream and its reduce) share one pool slot, so they run one
    after another."""
    spec, tables, af = setup(tmp_path, spark_server, rows=400, window={"gap": "30 minutes"}, group_by=["user_id"])
    (tmp_path / "typo.yml").write_text("name: typo\nsource: {path: [unclosed\n")  # costs this pipeline nothing
    af.env["SPARK_JOBS_STREAM_SCHEDULE"] = "none"  # only the run triggered below
    started = time.monotonic()
    create_backfill(af)
    with running_airflow(af):
        af.retry("dags", "unpause", "views_batch")
        af.retry("dags", "unpause", "views_stream")
        af.retry("dags", "trigger", "views_stream")
        runs = wait_for_runs(af, "views_batch", len(DAYS), timeout=900)
        [stream_run] = wait_for_runs(af, "views_stream", 1, timeout=600, run_type="manual")
        [error] = af.import_errors()  # as the dag-processor recorded it
    assert error["filepath"].endswith("pipeline_specs_check.py")
    assert f"invalid pipeline spec {tmp_path / 'typo.yml'}:\n  - not valid YAML at line 3" in error["error"]
    assert sorted(r["logical_date"][:10] for r in runs) == list(DAYS)
    assert af.runs("views_batch") == runs  # SPARK_JOBS_END_DATE: no scheduled run of a day without data
    assert [r["state"] for r in runs] == ["success"] * len(DAYS), [af.task_states("views_batch", r["run_id"]) for r in runs]
    assert stream_run["state"] == "success", af.task_states("views_stream", stream_run["run_id"])
    got = actual(tables.aggregates, spec)
    assert_matches(got, expected(read_landing(tmp_path / "landing"), spec), spec)
    assert (got["window_end"] - got["window_start"] >= "30min").all()
    writers = [(t["start_date"], t["end_date"], f"{dag} {t['task_id']} {run['run_id']}")
               for dag, dag_runs in (("views_batch", runs), ("views_stream", [stream_run]))
               for run in dag_runs for t in af.task_instances(dag, run["run_id"]) if t["task_id"] in ("reduce", "stream")]
    assert len(writers) == len(DAYS) + 2  # a reduce per day, the stream and its reduce
    writers.sort()
    for before, after in itertools.pairwise(writers):
        assert before[1] <= after[0], f"{before[2]} and {after[2]} ran at once: {before[:2]} / {after[:2]}"
    combines = [r for r in DeltaTable(tables.runs).to_pyarrow_table().to_pylist() if r["job"] == "combine"]
    # two days' combines race for the partials table: the loser re-plans inside the job, nothing fails
    assert sorted(r["batch"] for r in combines) == list(DAYS) and {r["status"] for r in combines} == {"success"}
    print(f"backfill of {len(DAYS)} days beside a stream run: {time.monotonic() - started:.0f}s")
