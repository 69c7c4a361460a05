"""The ``runs`` table: its columns, and the questions asked of it (Arrow, no Spark). Every job run appends one row
(``spark_jobs.jobs.run_record.recorded_run`` writes them). The quality gates reconcile a day's partials with the rows
its combine aggregated, the batch DAG skips a day combined after its newest landing file, and the inspect views list
the runs: all through here."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import pyarrow as pa

from spark_jobs.lake.reader import is_table, open_table

__all__ = ["ROLLBACK", "RUNS_SCHEMA", "dead_letter_rows_by_run", "latest_combines", "read_runs"]

_TS = pa.timestamp("us", tz="UTC")
RUNS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("pipeline", pa.string()), ("job", pa.string()), ("batch", pa.string()),
    ("status", pa.string()), ("started_at", _TS), ("finished_at", _TS), ("duration_s", pa.float64()),
    ("rows_in", pa.int64()), ("rows_aggregated", pa.int64()), ("rows_rejected", pa.int64()), ("inputs", pa.string()),
    ("versions_read", pa.string()), ("versions_written", pa.string()), ("backend", pa.string()),
    ("message", pa.string()),
    ("attempts", pa.int64()),  # commit attempts: more than 1 when the run lost races to concurrent writers
    ("files_quarantined", pa.int64()),  # landing files that could not be read (in dead_letter, one row each)
    ("files_skipped", pa.int64()),  # zero-byte landing files
])
# In ``inputs``: a quality-gate run that rolled a day's batch partials back to what ``aggregates``
# was built from; its ``rows_aggregated`` is the rows of the partials it put back.
ROLLBACK = "rollback"


def read_runs(path: str, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every run recorded in the ``runs`` table at ``path`` (``columns`` only); none without a table."""
    return open_table(path).read(columns).to_pylist() if is_table(path) else []


def latest_combines(path: str, days: Sequence[str] | None = None, *,
                    by: Literal["started_at", "finished_at"] = "finished_at",
                    rollbacks: bool = False) -> dict[str, dict[str, Any]]:
    """Per event day (of ``days``, or all), its latest successful ``combine`` run, latest by ``by``. ``rollbacks``: a
    gate run that rolled the day's partials back counts as a combine too (it put back the partials that stand), so
    the run returned is the one whose partials the day has."""
    columns = ["job", "batch", "status", "started_at", "finished_at", "inputs", "rows_aggregated"]
    latest: dict[str, dict[str, Any]] = {}
    for run in read_runs(path, columns):
        day = run["batch"]
        combined = run["job"] == "combine" and run["status"] == "success"
        rolled_back = rollbacks and run["job"] == "validate" and ROLLBACK in json.loads(run["inputs"] or "[]")
        if not (combined or rolled_back) or day is None or (days is not None and day not in days):
            continue
        if day not in latest or run[by] > latest[day][by]:
            latest[day] = run
    return latest


def dead_letter_rows_by_run(path: str) -> dict[str, int]:
    """Rows in the ``dead_letter`` table at ``path`` per ``run_id``; none without a table."""
    if not is_table(path):
        return {}
    counts = open_table(path).read(["run_id"]).group_by("run_id").aggregate([([], "count_all")])
    return dict(zip(counts["run_id"].to_pylist(), counts["count_all"].to_pylist(), strict=True))
