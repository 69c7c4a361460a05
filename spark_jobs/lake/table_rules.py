"""The pipeline's table rules, in one place: which partial files count, app ids, file layout.

Hybrid rule: once an event day has batch partials (a combine of that day), its streaming
partials no longer count. The batch combine saw every row of the day, late ones included, so
it supersedes what the stream accumulated; reduce, the stream and the gates all apply it here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from contextlib import suppress
from typing import TYPE_CHECKING, Literal

from spark_jobs.lake._types import Cluster, DataFile

if TYPE_CHECKING:
    from spark_jobs.spec import PipelineSpec, RollupSpec

__all__ = ["BATCH", "DAY", "DAY_MARGIN", "DEAD_LETTER_PARTITIONS", "PARTIALS_PARTITIONS", "STREAM", "STREAM_FILE_ROWS",
           "batch_days", "batch_files_in", "changelog_app_id", "counted_files", "day_bounds", "in_days", "is_batch",
           "partition_day", "reduce_app_id", "rollup_app_id", "sort_keys", "stream_app_id", "stream_layout",
           "window_cluster"]

DAY = "event_date"
BATCH, STREAM = "batch", "stream"  # the ``source`` partition of ``partials``
PARTIALS_PARTITIONS = (DAY, "source")
STREAM_FILE_ROWS = 8192  # the fewest aggregates rows a mini-batch writes to one file (but one file at least)
DEAD_LETTER_PARTITIONS = ("job", "batch")
# Windows reach at most a day past their events' day, and timestamps Spark hands back are in
# the driver's local time zone: a day of margin each side keeps every day-range filter safe.
DAY_MARGIN = dt.timedelta(days=1)


def reduce_app_id(spec: PipelineSpec) -> str:
    """The app transaction on ``aggregates``: the ``partials`` version reduce merged."""
    return f"{spec.name}.reduce"


def changelog_app_id(spec: PipelineSpec) -> str:
    """The app transaction on ``changelog``: the last ``aggregates`` version whose commit it tells (the stream's
    batches record their own, ``<pipeline>.stream``)."""
    return f"{spec.name}.changelog"


def rollup_app_id(spec: PipelineSpec, rollup: RollupSpec) -> str:
    """The app transaction on a rollup table: the ``aggregates`` version it reflects. It names the grain and keys, so a
    table built for another declaration counts as never refreshed: it is rebuilt, and never read as this one."""
    return f"{spec.name}.{rollup.table}:{rollup.grain.seconds}s:{','.join(rollup.by)}"


def stream_app_id(spec: PipelineSpec) -> str:
    """The app transaction on every table the stream writes: its last committed mini-batch."""
    return f"{spec.name}.stream"


def is_batch(f: DataFile) -> bool:
    return f.partition_values.get("source") == BATCH


def batch_days(files: Iterable[DataFile]) -> set[str]:
    """Event days (ISO dates) that have batch partials."""
    return {d for f in files if is_batch(f) and (d := f.partition_values.get(DAY)) is not None}


def counted_files(files: Iterable[DataFile]) -> dict[str, DataFile]:
    """The partial files that count (the hybrid rule), by path."""
    files = list(files)
    days = batch_days(files)
    return {f.path: f for f in files if is_batch(f) or f.partition_values.get(DAY) not in days}


def day_bounds(lo: dt.datetime, hi: dt.datetime) -> tuple[dt.date, dt.date]:
    """The event days rows with times in [lo, hi] (windows included) can belong to."""
    return lo.date() - DAY_MARGIN, hi.date() + DAY_MARGIN


def partition_day(name: str) -> str | None:
    """The ISO date of a landing partition directory's name (``event_date=YYYY-MM-DD``), None if it holds none."""
    day = name.removeprefix(f"{DAY}=")
    with suppress(ValueError):
        return day if day != name and len(day) == 10 and dt.date.fromisoformat(day) else None
    return None


def in_days(day: str | None, bounds: tuple[dt.date, dt.date]) -> bool:
    return day is None or bounds[0] <= dt.date.fromisoformat(day) <= bounds[1]


def sort_keys(spec: PipelineSpec) -> list[str]:
    """How ``aggregates`` rows are sorted in their files: by window first, so a day rewrites few files."""
    return [*spec.window.bounds[:1], *spec.group_by]


def window_cluster(spec: PipelineSpec, files: int, *, by: Literal["range", "hash"] = "range",
                   column: str = "window_start", tail_from: dt.datetime | None = None) -> Cluster | None:
    """About ``files`` files of ``aggregates`` by window start (or ``column``); None without a window."""
    return Cluster(column, max(files, 1), by=by, tail_from=tail_from) if spec.window.bounds else None


def batch_files_in(files: Iterable[DataFile], bounds: tuple[dt.date, dt.date] | None) -> list[DataFile]:
    """The batch partial files of the days in ``bounds`` (all days when None)."""
    return [f for f in files if is_batch(f) and (bounds is None or in_days(f.partition_values.get(DAY), bounds))]


def stream_layout(spec: PipelineSpec, span: tuple[dt.datetime, dt.datetime], rows: int | None = None
                  ) -> tuple[tuple[str, dt.datetime, dt.datetime] | None, Cluster | None]:
    """How a mini-batch rewrites ``aggregates``: the window starts it can touch, and about a file per window, so the
    next batch rewrites only the files of its own windows; but no file of fewer than ``STREAM_FILE_ROWS`` of the batch's
    ``rows`` (a backlog's batch spans days of windows: a file per hour would be many small files, whose writing and
    reading cost more than the boundary file's rewrite). Windows without a grid of starts (sessions: a heavy user's may
    have started weeks ago) are laid out about a file per day of the batch by their end, and those a later batch may
    still change (ending past its last event less the watermark and reach) in one of their own, rewritten alone."""
    window = spec.window
    starts = window.starts_between(*span)
    step = window.start_step
    if starts is None or step is None:  # by end: the sessions still open in a file of their own
        later = spec.stream.watermark.seconds + (window.reach.seconds if window.reach else 0)  # what a batch reaches back
        open_from = span[1] - dt.timedelta(seconds=later)
        return None, window_cluster(spec, (span[1] - span[0]).days + 1, column="window_end", tail_from=open_from)
    windows = int((starts[1] - starts[0]).total_seconds() // step.seconds) + 1
    if rows is not None:
        windows = min(windows, -(-rows // STREAM_FILE_ROWS))
    return ("window_start", *starts), window_cluster(spec, windows, by="hash")
