"""The questions every window kind answers, so that no job asks which kind it holds (Flink's ``SliceAssigner``).

*Stored* rows are what ``partials`` and the stream's state hold per key and batch: a window (tumbling, hopping), a
step-sized slice (cumulative), a partial session, or a key's rows of a day (no window). *Served* rows are what
``aggregates`` holds per key: :meth:`WindowKind.serve` turns stored rows into served ones (as they are, exploded into
the windows a slice is in, or merged into sessions). Each question has its Spark form (over DataFrames) and, where
the driver needs it, its Arrow form beside it."""

from __future__ import annotations

import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.durations import Duration, utc
from spark_jobs.key_match import join_on_keys, key_mask
from spark_jobs.spark_functions import F

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["BOUNDS", "RECOMBINE", "TS", "F", "Reach", "SizedWindows", "Stored", "WindowChange", "WindowKind",
           "epoch_micros", "floor_micros", "floor_ticks", "ticks", "vs_watermark"]

BOUNDS = ("window_start", "window_end")
RECOMBINE = "every day's partials are dropped and must be recombined"  # the effect of a change that costs "raw"
TS = pa.timestamp("us", tz="UTC")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
Cost = Literal["settings", "stored", "raw"]


@dataclass(frozen=True)
class WindowChange:
    """A change of window, as ``plan`` sorts it: what it costs and what ``apply`` does to the stored rows."""

    cost: Cost
    what: str
    effect: str
    retile: bool = False  # stored rows merge into the new kind's tiles (a coarser grid)
    unwindow: bool = False  # windows removed: each key's stored rows merge into one


@dataclass(frozen=True)
class Stored:
    """The lake's side of a reach: the counted stored rows by event day, and the served keys."""

    read: Callable[[dt.date | None, dt.date | None, DataFrame | None], DataFrame]  # days [lo, hi], of a frame's keys
    days: tuple[dt.date, dt.date] | None  # the first and last event day with stored rows
    served: Callable[[], tuple[DataFrame | None, int | None]]  # served key columns, and the version read


@dataclass(frozen=True)
class Reach:
    """What a change of some stored rows reaches: the served rows it replaces and the stored rows they merge."""

    stored: DataFrame  # the stored rows in reach (not served), without the changed rows not stored yet
    touched: DataFrame | None  # served key columns of the rows replaced (None: every row)
    prune: tuple[str, Any, Any] | None = None  # (column, lo, hi): where in ``aggregates`` the replaced rows lie
    days: tuple[dt.date, dt.date] | None = None  # the event days of stored rows read (None: all)
    read_version: int | None = None  # the ``aggregates`` version ``touched`` was read at
    cached: tuple[DataFrame, ...] = field(default_factory=tuple)  # released after the commit


class WindowKind(ABC):
    """One kind of window. Subclasses are frozen dataclasses holding their durations."""

    bounds: tuple[str, ...] = BOUNDS
    windows_per_row = 1  # stored rows one event makes
    rows_once = True  # each event counts in exactly one served row (sums of ``n_rows`` add up)
    serves_stored = True  # served rows are the stored rows as they are
    cut_per_key = False  # stored rows are cut per key: dropping a key cannot merge them
    assigned_by_key = False  # :meth:`assign` leaves rows partitioned by the keys: they group in place
    changelog_values: tuple[str, ...] = ()  # bounds that are values, not identity, in the changelog
    scope: tuple[str, ...] = BOUNDS  # the bounds within which a key's stored rows merge or serve together
    state_covers_reach = True  # the stored rows a non-late event reaches are all open, so in the stream's state
    state_holds_served = False  # the stream's state holds served rows whole (merged open sessions), not stored rows
    closes = True  # windows close at the watermark (late rows are rejected, closed stored rows leave state)

    # ------------------------------------------------------------------ what it is
    @abstractmethod
    def to_dict(self) -> dict[str, str] | None:
        """The spec's ``window`` mapping (None without a window)."""

    @property
    def reach(self) -> Duration | None:
        """How far from its events a served row reaches in time (None: without bound)."""
        return None

    @property
    def tile(self) -> Duration | None:
        """The unit rollups merge served rows in (their grains are whole numbers of it); None: no rollups."""
        return None

    @property
    def rollup_refusal(self) -> str:
        """Why served rows cannot merge into rollup buckets (asked when ``tile`` is None)."""
        return "rollups merge whole windows"

    @property
    def start_step(self) -> Duration | None:
        """The time between consecutive served window starts (None: no grid)."""
        return None

    def identity(self, group_by: Sequence[str]) -> list[str]:
        """The columns that name a served row in the changelog."""
        return [*group_by, *self.bounds]

    def fits(self, start: dt.datetime, end: dt.datetime) -> bool:
        """Whether a served row of these bounds can be this kind's (``apply`` adopting an old lake checks one)."""
        return True

    def starts_between(self, lo: dt.datetime, hi: dt.datetime) -> tuple[dt.datetime, dt.datetime] | None:
        """The served window starts that events in [lo, hi] can reach (None: any)."""
        return None

    def explain(self, phase: str) -> str | None:
        """A line for ``explain`` about how this kind cuts and merges, per phase."""
        return None

    # ------------------------------------------------------------------ Spark forms
    def assign(self, rows: DataFrame, *, event_time: str, keys: Sequence[str]) -> DataFrame:
        """Raw rows with their stored window bounds (one row per stored window)."""
        return rows

    def serve(self, rows: DataFrame, keys: Sequence[str]) -> DataFrame:
        """Stored rows relabelled with the served window(s) they merge into."""
        return rows

    def merge_stored(self, rows: DataFrame, keys: Sequence[str]) -> DataFrame:
        """Stored rows of one scope (a key's day) relabelled with the stored row they merge into."""
        return rows

    def count_once(self, event_time: str) -> Column:
        """The rows of a group of stored rows, each event once (an aggregate's ``count(*)``)."""
        return F.count(F.lit(1))

    def is_open(self, watermark: dt.datetime) -> Column:
        """Whether a stored row still belongs to a window the watermark has not closed (one ending after it)."""
        return vs_watermark(F.unix_micros(F.col("window_end")), ">", watermark)

    def with_late(self, rows: DataFrame, *, event_time: str, keys: Sequence[str], valid: Column,
                  watermark: dt.datetime) -> DataFrame:
        """``rows`` with ``_late``: the ``valid`` rows whose every window the watermark closed (lateness is per window,
        as in Flink and Spark: :meth:`open_only` drops a row from its closed windows only)."""
        return rows.withColumn("_late", F.lit(False))

    def may_be_late(self, event_time: Column, watermark: dt.datetime) -> Column:
        """True for every row :meth:`with_late` can find late, from the row alone (only these carry their records)."""
        return F.lit(False)

    def open_only(self, rows: DataFrame, watermark: dt.datetime) -> DataFrame:
        """Assigned rows that are not late, without their windows the watermark closed (a reject's bounds are
        NULL: it stays). Tumbling windows and sessions: a row that is not late has no closed window."""
        return rows

    def touched(self, changed: DataFrame, keys: Sequence[str]) -> DataFrame:
        """The served key columns a change of the stored ``changed`` rows rewrites."""
        return self.serve(changed, keys).select(*keys, *self.bounds).distinct()

    def within(self, stored: DataFrame, changed: DataFrame, keys: Sequence[str], *, anti: bool = False) -> DataFrame:
        """The ``stored`` rows that merge with the ``changed`` ones into a served row (``anti``: the others)."""
        columns = [*keys, *self.scope]
        if not columns:  # one global key
            return stored.limit(0) if anti else stored
        return join_on_keys(stored, changed.select(*columns).distinct(), columns, "left_anti" if anti else "left_semi")

    def reach_of(self, changed: DataFrame, stored: Stored, keys: Sequence[str]) -> Reach:
        """The served rows a change of the stored ``changed`` rows reaches, and the stored rows they merge."""
        touched = self.touched(changed, keys)
        prune, days = None, None
        if self.bounds:
            found = touched.agg(F.min("window_start").alias("lo"), F.max("window_end").alias("hi")).first()
            if found is not None and found["lo"] is not None:
                prune = ("window_start", found["lo"], found["hi"])
                days = (found["lo"].date() - _DAY, found["hi"].date() + _DAY)
        rows = stored.read(days[0] if days else None, days[1] if days else None, None)
        return Reach(self.within(rows, changed, keys), touched, prune, days)

    def alone(self, changed: DataFrame, stored: DataFrame, keys: Sequence[str]) -> tuple[DataFrame, DataFrame] | None:
        """The ``changed`` stored rows apart: those that are each a served row as they are (no other changed row
        nor any of ``stored`` merges with them) and the rest; None: no test cheaper than the merge itself."""
        return None

    def reach_in_state(self, changed: DataFrame, state: DataFrame, keys: Sequence[str], *, few: bool = False) -> Reach:
        """Where the state holds served rows whole: the ones the ``changed`` stored rows merge with."""
        raise NotImplementedError(f"the stream's state of {self} windows holds stored rows")

    def next_state(self, state: DataFrame, served: DataFrame, keys: Sequence[str], columns: Sequence[str], *,
                   day: str) -> DataFrame:
        """Where the state holds served rows whole: the state after a batch whose reached rows are ``served``."""
        raise NotImplementedError(f"the stream's state of {self} windows holds stored rows")

    # ------------------------------------------------------------------ Arrow and driver forms of the above
    def serve_arrow(self, rows: pa.Table, keys: Sequence[str]) -> pa.Table:
        """The Arrow form of :meth:`serve`."""
        return rows

    def touched_arrow(self, changed: pa.Table, keys: Sequence[str]) -> pa.Table:
        columns = [*keys, *self.bounds]  # none: one global key, any row matches every row
        rows = changed.select(columns)
        return rows.group_by(columns, use_threads=False).aggregate([]) if columns else rows

    def within_arrow(self, stored: pa.Table, changed: pa.Table, keys: Sequence[str], *, anti: bool = False) -> pa.Table:
        hit = key_mask(stored, [*keys, *self.scope], changed)
        return stored.filter(pa.array(~hit if anti else hit))

    def alone_arrow(self, changed: pa.Table, live: np.ndarray, state: pa.Table, stored: pa.Table,
                    keys: Sequence[str]) -> np.ndarray:
        """The Arrow form of :meth:`alone`: which ``live`` rows of ``changed`` are each a served row as they are. Where
        stored rows serve as they are: a row whose key and window no other live row, state row or ``stored`` row has."""
        columns = [*keys, *self.bounds]
        if not (live.any() and self.serves_stored and columns):
            return np.zeros(changed.num_rows, dtype=bool)
        counts = changed.filter(pa.array(live)).select(columns).group_by(columns, use_threads=False).aggregate(
            [([], "count_all")])
        once = counts.filter(pc.equal(counts.column("count_all"), 1))
        return live & key_mask(changed, columns, once) & ~key_mask(changed, columns, state) & ~key_mask(
            changed, columns, stored)

    def reach_in_state_arrow(self, changed: pa.Table, state: pa.Table, keys: Sequence[str]) -> pa.Table:
        raise NotImplementedError(f"the stream's state of {self} windows holds stored rows")

    def next_state_arrow(self, state: pa.Table, served: pa.Table, keys: Sequence[str], *, day: str) -> pa.Table:
        raise NotImplementedError(f"the stream's state of {self} windows holds stored rows")

    def rollup_rows(self, rows: pa.Table) -> pa.Table:
        """The served rows (with their bounds) that tile rollup buckets: every one, for windows that tile."""
        return rows

    def is_open_arrow(self, rows: pa.Table, watermark: dt.datetime) -> pa.Array:
        return pc.greater(rows.column("window_end"), pa.scalar(watermark, TS))

    # ------------------------------------------------------------------ spec changes
    def coarsen(self, rows: DataFrame) -> DataFrame:
        """Stored rows of a finer grid on this kind's (``apply`` of a change that retiles)."""
        raise NotImplementedError(f"{self} windows are not a grid that coarsens")

    def coarsen_arrow(self, rows: pa.Table) -> pa.Table:
        raise NotImplementedError(f"{self} windows are not a grid that coarsens")

    def change_to(self, new: WindowKind) -> WindowChange:
        """What a change from this kind to ``new`` costs (``plan``)."""
        return WindowChange("raw", f"window {self} -> {new}", f"the stored windows do not tile the new ones: "
                                                             f"{RECOMBINE}")


@dataclass(frozen=True)
class SizedWindows(WindowKind):
    """Windows of one ``size`` on a grid from the epoch (tumbling, hopping, cumulative)."""

    size: Duration

    @property
    def reach(self) -> Duration:
        return self.size

    def fits(self, start: dt.datetime, end: dt.datetime) -> bool:
        return (end - start).total_seconds() == self.size.seconds

    def with_late(self, rows: DataFrame, *, event_time: str, keys: Sequence[str], valid: Column,
                  watermark: dt.datetime) -> DataFrame:
        """Late: the event's last window (the one starting in its ``start_step``) ends at or before the watermark."""
        return rows.withColumn("_late", valid & self.may_be_late(F.col(event_time), watermark))

    def may_be_late(self, event_time: Column, watermark: dt.datetime) -> Column:
        step = self.start_step
        assert step is not None  # every sized kind has a grid of starts
        return vs_watermark(floor_micros(F.unix_micros(event_time), step) + F.lit(self.size.micros), "<=", watermark)

    def starts_between(self, lo: dt.datetime, hi: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
        return lo - dt.timedelta(seconds=self.size.seconds), hi


_DAY = dt.timedelta(days=1)  # windows reach at most a day past their events' day; Spark hands back local times


def floor_micros(micros: Column, step: Duration) -> Column:
    """The start of the ``step`` that holds ``micros``, counted from the epoch as Spark counts windows."""
    return micros - F.pmod(micros, F.lit(step.micros))


def vs_watermark(micros: Column, op: Literal["<", "<=", ">", ">="], watermark: dt.datetime) -> Column:
    """``micros op watermark`` in epoch microseconds, the watermark a decimal literal: Spark writes a long one into its
    generated code, where each batch's watermark made the code new, to compile and warm up again; a decimal is not."""
    left, right = micros.cast("decimal(18,0)"), F.lit(Decimal(epoch_micros(utc(watermark)))).cast("decimal(18,0)")
    return getattr(left, {"<": "__lt__", "<=": "__le__", ">": "__gt__", ">=": "__ge__"}[op])(right)


def ticks(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Microseconds since the epoch of a timestamp column."""
    return np.asarray(pc.cast(column, TS).cast(pa.int64()).to_numpy(zero_copy_only=False))


def epoch_micros(t: dt.datetime) -> int:
    return (t - EPOCH) // dt.timedelta(microseconds=1)


def floor_ticks(values: np.ndarray, step: Duration) -> np.ndarray:
    return values // step.micros * step.micros
