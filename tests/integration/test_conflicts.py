"""A job that loses a commit race re-plans from the new snapshot and commits again.

The races are real: between a job's plan and its commit (the failpoint just before the commit),
another real job commits to the same Delta table, so the job's commit is checked against a table
that moved since it planned. Every table must still equal the oracle with each key once, and ``runs`` must say how
many attempts the job needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from spark_jobs._failpoints import once_at
from spark_jobs.errors import ConflictError
from spark_jobs.jobs import combine, reduce
from spark_jobs.jobs.conflicts import RetryPolicy, retry_conflicts
from spark_jobs.lake import PipelineTables
from spark_jobs.lake.runs_table import read_runs
from spark_jobs.spec import PipelineSpec
from spark_jobs.stream import query as stream
from tests.builders import FAST_AGGREGATES, day_events, make_spec, write_day
from tests.integration.test_stream import land_sliced, with_stream
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

D1, D2, D3 = "2024-03-01", "2024-03-02", "2024-03-03"


def keys_once(path: str, keys: list[str]) -> None:
    """Every version of the table holds each key once."""
    latest = DeltaTable(path).version()
    for version in range(latest + 1):
        df = DeltaTable(path, version=version).to_pandas(columns=keys)
        assert not df.duplicated().any(), f"version {version} of {path} holds a key twice"


def run_record(spec, run_id: str) -> dict[str, Any]:
    rows = [r for r in read_runs(PipelineTables(spec.lake, spec.name).runs) if r["run_id"] == run_id]
    assert len(rows) == 1, rows
    return rows[0]


def test_two_combines_of_one_day_both_land(spark, tmp_path):
    spec = make_spec(tmp_path, window={"size": "1 hour"}, aggregates=FAST_AGGREGATES)
    write_day(tmp_path / "landing", D1, day_events(D1, 400, seed=1, rejected=3), files=2)
    combine.run(spark, spec, D1)  # the day is rerun below by two combines at once
    with once_at("commit:partials:before", lambda: combine.run(spark, spec, D1)) as raced:
        record = combine.run(spark, spec, D1, run_id="combine-raced")
    # replacing a day's partition does not depend on what the table held: the lost commit is retried against
    # the winner's snapshot with the files already staged, inside the job's one attempt
    assert raced() and record.attempts == 1 and record.status == "success"
    reduce.run(spark, spec)
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(tmp_path / "landing"), spec), spec)
    assert run_record(spec, "combine-raced")["attempts"] == 1
    assert DeltaTable(tables.dead_letter).to_pyarrow_table().num_rows == 3  # replaced, not doubled


def reduced_day_rerun_and_new_day(spark, root: Path) -> tuple[PipelineSpec, Path]:
    """Day 1 combined and reduced, then combined again (the next reduce has changed files to merge);
    day 2 landed for the stream."""
    spec = with_stream(make_spec(root, window={"size": "1 hour"}, aggregates=FAST_AGGREGATES),
                       max_files_per_batch=10, watermark="1 day")
    landing = root / "landing"
    write_day(landing, D1, day_events(D1, 300, seed=1), files=1)
    combine.run(spark, spec, D1)
    reduce.run(spark, spec)
    combine.run(spark, spec, D1)
    land_sliced(landing, D2, day_events(D2, 300, seed=2), files=2)
    return spec, landing


def test_a_reduce_that_loses_to_the_stream_replans_and_merges(spark, tmp_path):
    """The stream rewrites ``aggregates`` while a reduce plans: the reduce's commit is refused and
    its second plan, from the stream's version, merges the new day without losing the stream's keys."""
    spec, landing = reduced_day_rerun_and_new_day(spark, tmp_path)
    with once_at("commit:aggregates:before", lambda: stream.run(spark, spec, available_now=True)) as raced:
        record = reduce.run(spark, spec, run_id="reduce-raced")
    assert raced() and record.attempts == 2 and record.status == "success", record
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(landing), spec), spec)
    keys_once(tables.aggregates, list(spec.key_columns))
    assert run_record(spec, "reduce-raced")["attempts"] == 2


def test_a_mini_batch_that_loses_to_a_reduce_commits_again_in_place(spark, tmp_path):
    spec, landing = reduced_day_rerun_and_new_day(spark, tmp_path)
    with once_at("commit:aggregates:before", lambda: reduce.run(spark, spec)) as raced:
        summary = stream.run(spark, spec, available_now=True)
    assert raced() and len(summary.batches) == 1
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(landing), spec), spec)
    keys_once(tables.aggregates, list(spec.key_columns))
    streamed = [r for r in read_runs(tables.runs) if r["job"] == "stream"]
    assert [r["attempts"] for r in streamed] == [2]
    # the batch committed once to each of its tables: its place (batch id 0) did not move
    assert DeltaTable(tables.stream_state).transaction_version(f"{spec.name}.stream") == 0


def test_retries_are_bounded_and_the_last_error_says_what_to_do():
    waits: list[float] = []

    def always(attempt: int) -> None:
        raise ConflictError(f"commit to Delta table /lake/t lost to a concurrent writer (attempt {attempt})")

    with pytest.raises(ConflictError, match="lost 3 commit races in a row and gave up") as info:
        retry_conflicts(always, what="reduce", policy=RetryPolicy(attempts=3, base_s=1, cap_s=1.5), sleep=waits.append)
    assert "aggregates_<pipeline>" in str(info.value) and "SPARK_JOBS_COMMIT_ATTEMPTS" in str(info.value)
    assert len(waits) == 2 and 0 <= waits[0] <= 1 and 0 <= waits[1] <= 1.5
    assert retry_conflicts(lambda n: n, what="x", policy=RetryPolicy(attempts=1)) == 1


def test_a_bad_attempts_setting_is_a_usage_error(monkeypatch):
    from spark_jobs.errors import UsageError

    monkeypatch.setenv("SPARK_JOBS_COMMIT_ATTEMPTS", "0")
    with pytest.raises(UsageError, match="SPARK_JOBS_COMMIT_ATTEMPTS='0'"):
        RetryPolicy.from_env()
