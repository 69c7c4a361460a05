"""spark_jobs.lake.reader and spark_jobs.lake.runs_table: Arrow reads of Delta tables and the runs table, no Spark."""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from spark_jobs.lake import AppTxn
from spark_jobs.lake.reader import CommitChange, is_table, open_table, table_version
from spark_jobs.lake.runs_table import ROLLBACK, RUNS_SCHEMA, dead_letter_rows_by_run, latest_combines, read_runs

UTC = dt.UTC


def test_a_snapshot_reads_versions_metadata_log_and_rows(tmp_path):
    path = str(tmp_path / "t")
    assert not is_table(path) and table_version(path) is None
    write_deltalake(path, pa.table({"day": ["d1", "d2"], "x": [1, 2]}), partition_by=["day"])
    time.sleep(0.01)
    between = dt.datetime.now(UTC)
    time.sleep(0.01)
    write_deltalake(path, pa.table({"day": ["d1"], "x": [3]}), partition_by=["day"], mode="append")
    assert is_table(path) and table_version(path) == 1

    table = open_table(path)
    assert table.version() == 1 and table.path == path
    assert table.schema().names == ["day", "x"] and table.partition_columns == ["day"]
    assert table.num_files() == 3 and table.add_actions().num_rows == 3
    assert [h["version"] for h in table.history()] == [1, 0] and len(table.history(1)) == 1
    assert table.version_at(between) == 0 and table.version_at(dt.datetime.now(UTC)) == 1
    assert table.version_at(dt.datetime(2000, 1, 1, tzinfo=UTC)) is None
    assert sorted(table.read(["x"]).column("x").to_pylist()) == [1, 2, 3]
    assert table.read(["x"], filter=pc.field("day") == "d1").column("x").to_pylist() in ([1, 3], [3, 1])
    assert table.head(1, columns=["x"]).num_rows == 1
    first = table.at(0)
    assert first.version() == 0 and first.read().num_rows == 2
    assert open_table(path, 0).read().num_rows == 2


def test_commit_changes_count_files_rows_and_app_transactions_of_each_commit(tmp_path):
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"day": ["d1", "d1", "d2"], "x": [1, 2, 3]}), partition_by=["day"])
    write_deltalake(path, pa.table({"day": ["d1"], "x": [4]}), partition_by=["day"], mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction("views.reduce", 7)]))
    write_deltalake(path, pa.table({"day": ["d1"], "x": [5]}), partition_by=["day"], mode="overwrite",
                    predicate="day = 'd1'")
    txn = (AppTxn("views.reduce", 7),)
    changes = open_table(path).commit_changes(0)
    assert changes == [
        CommitChange(0, files_added=2, files_removed=0, rows_added=3, rows_removed=0),
        CommitChange(1, files_added=1, files_removed=0, rows_added=1, rows_removed=0, app_txns=txn),
        CommitChange(2, files_added=1, files_removed=2, rows_added=1, rows_removed=3),
    ]
    assert open_table(path).commit_changes(2) == changes[2:]  # removed rows from the snapshot before

    DeltaTable(path, version=1).create_checkpoint()
    os.remove(os.path.join(path, "_delta_log", f"{0:020d}.json"))  # log cleanup: version 0 is gone
    assert open_table(path).commit_changes(1) == [  # a file of version 0 was removed: its rows are not known
        changes[1], CommitChange(2, files_added=1, files_removed=2, rows_added=1, rows_removed=None)]
    assert open_table(path).commit_changes(0)[0] == CommitChange(0)  # its log file is gone: nothing is known


def _run(job: str, batch: str | None, status: str, started: int, finished: int, rows: int,
         inputs: list[str] | None = None, run_id: str = "r") -> dict:
    day = dt.datetime(2024, 3, 2, tzinfo=UTC)
    return {"run_id": run_id, "pipeline": "views", "job": job, "batch": batch, "status": status,
            "started_at": day + dt.timedelta(minutes=started), "finished_at": day + dt.timedelta(minutes=finished),
            "duration_s": 60.0 * (finished - started), "rows_in": rows, "rows_aggregated": rows, "rows_rejected": 0,
            "inputs": json.dumps(inputs or []), "versions_read": "{}", "versions_written": "{}",
            "backend": "embedded", "message": ""}


def test_the_latest_combine_of_a_day_by_start_or_finish_and_with_rollbacks(tmp_path):
    path = str(tmp_path / "runs")
    assert read_runs(path) == [] and latest_combines(path) == {}
    runs = [
        _run("combine", "2024-03-01", "success", 0, 10, 100),
        _run("combine", "2024-03-01", "success", 1, 5, 90),  # started later, finished earlier
        _run("combine", "2024-03-01", "failed", 20, 21, 0),
        _run("validate", "2024-03-01", "failed", 30, 31, 80, inputs=["suite:outputs", ROLLBACK]),
        _run("combine", "2024-03-02", "success", 0, 1, 7),
        _run("reduce", None, "success", 40, 41, 0),
    ]
    write_deltalake(path, pa.Table.from_pylist(runs, schema=RUNS_SCHEMA))
    assert len(read_runs(path)) == 6 and read_runs(path, ["job"])[0].keys() == {"job"}
    by_finish = latest_combines(path)
    assert {d: r["rows_aggregated"] for d, r in by_finish.items()} == {"2024-03-01": 100, "2024-03-02": 7}
    by_start = latest_combines(path, ["2024-03-01"], by="started_at")
    assert list(by_start) == ["2024-03-01"] and by_start["2024-03-01"]["rows_aggregated"] == 90
    with_rollbacks = latest_combines(path, ["2024-03-01", "2024-03-02"], rollbacks=True)
    assert {d: r["rows_aggregated"] for d, r in with_rollbacks.items()} == {"2024-03-01": 80, "2024-03-02": 7}


def test_dead_letter_rows_are_counted_per_run(tmp_path):
    path = str(tmp_path / "dead_letter")
    assert dead_letter_rows_by_run(path) == {}
    write_deltalake(path, pa.table({"run_id": ["a", "b", "a"], "reason": ["x", "y", "z"]}))
    assert dead_letter_rows_by_run(path) == {"a": 2, "b": 1}
