"""What the rollup page and its JSON route share: the form's defaults, its ``by`` text, and the chart's metrics.

The rollup itself is :func:`spark_jobs.inspection.rollup.rollup`; the spec comes from
:func:`spark_jobs.inspection.specs.find_spec`. Nothing here reads more than the newest window's start.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.inspection.rollup import Rollup, parse_by, parse_grain
from spark_jobs.inspection.views import is_number, parse_time
from spark_jobs.windows.kind import EPOCH

from .chart import COLORS

if TYPE_CHECKING:
    from spark_jobs.lake.reader import Snapshot
    from spark_jobs.spec import PipelineSpec

__all__ = ["MAX_ROLLUP_ROWS", "MAX_SERIES", "RollupForm", "chart_metrics", "default_range", "fmt_time"]

MAX_ROLLUP_ROWS = 10_000  # a bigger answer is refused: a coarser grain, fewer keys or a where makes it smaller
MAX_SERIES = len(COLORS)  # lines drawn: the key combinations with the largest totals, a colour each
_DAY = 86_400


def fmt_time(t: dt.datetime) -> str:
    """A time as the form shows it (UTC, seconds only when there are some)."""
    t = t.astimezone(dt.UTC)
    return f"{t:%Y-%m-%d %H:%M:%S}" if t.second or t.microsecond else f"{t:%Y-%m-%d %H:%M}"


def default_range(snapshot: Snapshot, spec: PipelineSpec) -> tuple[dt.datetime, dt.datetime]:
    """The last day of data: the UTC day of the newest window (or the last whole day of windows before its end,
    when windows do not divide a day; or the newest window, when windows are longer than a day)."""
    size = spec.window.tile.seconds if spec.window.tile else _DAY
    has_windows = "window_start" in snapshot.schema().names
    last = pc.max(snapshot.read(["window_start"]).column("window_start")).as_py() if has_windows else None
    last = last or dt.datetime.now(dt.UTC)  # no windows yet: today
    last = last if last.tzinfo else last.replace(tzinfo=dt.UTC)
    if _DAY % size == 0:
        start = last.replace(hour=0, minute=0, second=0, microsecond=0)
        return start, start + dt.timedelta(days=1)
    offset = int((last - EPOCH).total_seconds()) % size  # windows count from the epoch
    end = last - dt.timedelta(seconds=offset, microseconds=last.microsecond) + dt.timedelta(seconds=size)
    return end - dt.timedelta(seconds=max(1, _DAY // size) * size), end


@dataclass(frozen=True)
class RollupForm:
    """The request as text, as the form shows it: defaults filled in, the user's own text kept."""

    start: str
    end: str
    by: str
    grain: str
    where: str | None

    @classmethod
    def with_defaults(cls, snapshot: Snapshot, spec: PipelineSpec, *, start: str | None, end: str | None,
                      by: str | None, grain: str | None, where: str | None) -> RollupForm:
        """Blank from/to are the last day of data, by not given is every key, a blank grain is ``all``."""
        if not start or not end:
            first, last = default_range(snapshot, spec)
            start, end = start or fmt_time(first), end or fmt_time(last)
        return cls(start, end, ", ".join(spec.group_by) if by is None else by, grain or "all", where or None)

    def request(self, spec: PipelineSpec) -> Rollup:
        """The :class:`Rollup` to run; :class:`InspectError` for bad time, key or grain text."""
        return Rollup(parse_time(self.start), parse_time(self.end), parse_by(self.by, spec), parse_grain(self.grain),
                      self.where)


def chart_metrics(result: pa.Table | None, spec: PipelineSpec) -> list[str]:
    """The columns a chart can draw: the numeric aggregates (all of them when the result has no rows), ``n_rows``."""
    names = [a.name for a in spec.aggregates]
    if result is not None:
        types = dict(zip(result.column_names, result.schema.types, strict=True))
        names = [n for n in names if n in types and (is_number(types[n]) or pa.types.is_null(types[n]))]
    return [*names, "n_rows"]
