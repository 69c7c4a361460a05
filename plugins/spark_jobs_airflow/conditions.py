"""Run-time conditions of the DAGs, computed from the lake's ``runs`` table (delta-rs, no Spark)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

__all__ = ["batch_date", "skip_unchanged_day"]


def batch_date(context: Any) -> str:
    """What the ``DATE`` template renders: the ``date`` param, the logical date or the trigger day."""
    if date := (context.get("params") or {}).get("date"):
        return str(date)
    run = context["dag_run"]
    return (run.logical_date or run.run_after).strftime("%Y-%m-%d")


def skip_unchanged_day(pipeline: str) -> Callable[[Any], str | None]:
    """A ``skip_if`` for combine: skip a day combined successfully after its newest landing file, by the spec the
    lake records (a day whose partials predate an aggregate a spec change added is recombined). The
    ``force_recombine`` param turns it off. Combine is idempotent either way; this only saves a Spark job when a
    backfill passes over days that have not changed."""

    def check(context: Any) -> str | None:
        if (context.get("params") or {}).get("force_recombine"):
            return None
        from spark_jobs.lake import PipelineTables, storage
        from spark_jobs.lake.coverage import day_versions
        from spark_jobs.lake.runs_table import latest_combines
        from spark_jobs.lake.spec_record import current
        from spark_jobs.spec import load_spec

        date = batch_date(context)
        spec = load_spec(pipeline)
        newest = max((storage.modified(f) for f in storage.list_dir(spec.source.partition_path(date))), default=None)
        combined = latest_combines(PipelineTables(spec.lake, spec.name).runs, [date], by="started_at").get(date)
        if combined is None or newest is None:
            return None
        record = current(spec.lake, spec.name)  # the day's partials must hold every aggregate of the spec it records
        needed = max([record.layout_since, *record.coverage.values()]) if record is not None else 0
        if needed and day_versions(PipelineTables(spec.lake, spec.name).partials).get(date, 0) < needed:
            return None
        last = combined["started_at"]
        if last.timestamp() > newest:
            return (f"{date} was combined at {last:%Y-%m-%d %H:%M:%S} UTC, after its newest landing file "
                    f"({dt.datetime.fromtimestamp(newest, dt.UTC):%Y-%m-%d %H:%M:%S} UTC); "
                    "trigger with force_recombine=true to combine it again")
        return None

    return check
