"""One row in the ``runs`` table per job run, written whether the run succeeds or fails (the table's columns and
the queries of it live in :mod:`spark_jobs.lake.runs_table`)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from spark_jobs.lake import Lake, PipelineTables
from spark_jobs.lake.runs_table import RUNS_SCHEMA

__all__ = ["RunRecord", "new_run_id", "recorded_run"]

log = logging.getLogger("spark_jobs")


def new_run_id(job: str) -> str:
    return f"{job}-{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


@dataclass
class RunRecord:
    """What a run read, wrote and counted; ``status`` is success, noop or failed."""

    run_id: str
    pipeline: str
    job: str
    batch: str | None
    backend: str
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    finished_at: datetime | None = None
    status: str = "running"
    rows_in: int = 0
    rows_aggregated: int = 0
    rows_rejected: int = 0
    inputs: list[str] = field(default_factory=list)
    versions_read: dict[str, int | None] = field(default_factory=dict)
    versions_written: dict[str, int | None] = field(default_factory=dict)
    message: str = ""
    attempts: int = 1  # plan-and-commit attempts (see ``jobs.conflicts``)
    files_quarantined: int = 0  # landing files that could not be read, each a row of dead_letter
    files_skipped: int = 0  # zero-byte landing files

    @property
    def duration_s(self) -> float:
        end = self.finished_at or datetime.now(UTC)
        return (end - self.started_at).total_seconds()

    def to_arrow(self) -> pa.Table:
        row: dict[str, Any] = asdict(self) | {"duration_s": self.duration_s}
        row |= {key: json.dumps(row[key]) for key in ("inputs", "versions_read", "versions_written")}
        return pa.Table.from_pylist([row], schema=RUNS_SCHEMA)

    def summary(self) -> str:
        files = (f", {self.files_quarantined} file(s) quarantined" if self.files_quarantined else "") + (
            f", {self.files_skipped} empty file(s) skipped" if self.files_skipped else "")
        retries = f" after {self.attempts - 1} lost commit races" if self.attempts > 1 else ""
        return (f"{self.job} {self.batch or ''} {self.status}: rows in {self.rows_in}, aggregated "
                f"{self.rows_aggregated}, rejected {self.rows_rejected}{files}, wrote {self.versions_written} "
                f"in {self.duration_s:.1f}s{retries} (run {self.run_id})").replace("  ", " ")


@contextmanager
def recorded_run(lake: Lake, tables: PipelineTables, *, job: str, batch: str | None,
                 run_id: str | None) -> Iterator[RunRecord]:
    """Time the block and append its record to ``runs``; a failure is recorded, then re-raised."""
    run = RunRecord(run_id or new_run_id(job), tables.pipeline, job, batch, lake.name)
    try:
        yield run
        if run.status == "running":
            run.status = "success"
    except BaseException as exc:
        run.status = "failed"
        run.message = f"{type(exc).__name__}: {exc}"[:4000]
        raise
    finally:
        run.finished_at = datetime.now(UTC)
        log.info("%s", run.summary())  # which tells the run's seconds
        try:
            lake.append_rows(run.to_arrow(), tables.runs, metadata={"run_id": run.run_id, "job": job})
        except Exception:  # the run's own outcome (its error, or none) must not be hidden by the record's: logged
            log.exception("could not record run %s in %s", run.run_id, tables.runs)
