"""Session windows: ``[first event, last event + gap)`` per key, as Flink's MergingWindowSet merges them.

An event at or before ``last + gap`` joins a session, so sessions that touch merge (Spark's ``session_window``, Flink's
SESSION). Each combine and mini-batch stores the partial sessions of its own rows; a served session is the merge of
every partial that touches it, however many days and batches they came from. Merging touching intervals is exact: each
partial holds a run of events less than ``gap`` apart."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.durations import Duration, utc
from spark_jobs.key_match import join_on_keys, key_mask
from spark_jobs.persisted import persisted
from spark_jobs.windows.kind import RECOMBINE, TS, F, Reach, Stored, WindowChange, WindowKind, ticks, vs_watermark

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["Sessions"]

_CUT = ("_session_start", "_session_end")  # the bounds of the late-row cut (no spec column starts with "_")

_EXPLAIN = {
    "combine": "sessions: per key, events ordered by time; a new session after a gap of more than {gap}; "
               "window_start = first event, window_end = last event + {gap}",
    "reduce": "session merge (MergingWindowSet): per key, partial sessions ordered by start; one that starts at or "
              "before the latest end so far joins it (the halves of a session two days cut, or that an event "
              "bridges); window_start/end = the merged bounds, then grouped as below",
    "stream": "sessions: each mini-batch's partial sessions merged with the open sessions the state holds whole "
              "(one merged accumulator each, as Flink's MergingWindowSet); the partial sessions that count are read "
              "only where the state cannot answer (a day a batch combine superseded, a row reaching a closed "
              "session)"}


@dataclass(frozen=True)
class Sessions(WindowKind):
    gap: Duration
    serves_stored = False
    cut_per_key = True
    assigned_by_key = True
    state_covers_reach = False  # its state holds whole open sessions, not the stored rows a reach reads
    state_holds_served = True
    scope = ()  # a key's partial sessions merge with each other whatever their bounds
    changelog_values = ("window_end",)

    def to_dict(self) -> dict[str, str]:
        return {"gap": str(self.gap)}

    def __str__(self) -> str:
        return f"sessions (gap {self.gap})"

    @property
    def reach(self) -> Duration:
        return self.gap

    @property
    def rollup_refusal(self) -> str:
        return ("rollups merge whole tumbling windows, and sessions have no fixed bucket; drop rollups from a "
                "session pipeline (each session row is in aggregates: `inspect show <pipeline>.aggregates`)")

    def identity(self, group_by: Sequence[str]) -> list[str]:
        """A session is named by its key and start: one that grows keeps its name, one a merge moves is new."""
        return [*group_by, "window_start"]

    def explain(self, phase: str) -> str | None:
        return _EXPLAIN[phase].format(gap=self.gap)

    def change_to(self, new: WindowKind) -> WindowChange:
        return WindowChange("raw", f"window {self} -> {new if new.bounds else 'none'}",
                            f"sessions are cut from the events: {RECOMBINE}")

    # ------------------------------------------------------------------ Spark forms
    def assign(self, rows: DataFrame, *, event_time: str, keys: Sequence[str]) -> DataFrame:
        """Gaps and islands: each event is a session ``[t, t + gap)``, merged as :meth:`serve` merges partials. Rows
        :meth:`with_late` cut keep its sessions: a valid row that is not late is in the same one (its session holds
        valid rows that are not late alone), and the others' bounds are never read."""
        if _CUT[0] in rows.columns:
            return rows.withColumnsRenamed(dict(zip(_CUT, self.bounds, strict=True)))
        return self.serve(rows.withColumns(self._own_session(F.col(event_time))), keys)

    def _own_session(self, t: Column) -> dict[str, Column]:
        return {"window_start": t, "window_end": F.timestamp_micros(F.unix_micros(t) + F.lit(self.gap.micros))}

    def serve(self, rows: DataFrame, keys: Sequence[str]) -> DataFrame:
        """Partial sessions relabelled with the session they belong to: per key, sorted by start, a partial joins
        the one before it when it starts at or before the latest end so far."""
        from pyspark.sql import Window

        by_key = Window.partitionBy(*keys).orderBy("window_start", "window_end")
        latest = F.max("window_end").over(by_key.rowsBetween(Window.unboundedPreceding, -1))  # once: Spark repeats it
        rows = rows.withColumn("_new", latest).withColumn("_new", F.when(  # for each use of its column
            F.col("_new").isNull() | (F.col("window_start") > F.col("_new")), 1).otherwise(0))
        rows = rows.withColumn("_session", F.sum("_new").over(by_key.rowsBetween(Window.unboundedPreceding,
                                                                                Window.currentRow)))
        session = Window.partitionBy(*keys, "_session")
        return rows.withColumns({"window_start": F.min("window_start").over(session),
                                 "window_end": F.max("window_end").over(session)}).drop("_new", "_session")

    merge_stored = serve

    def with_late(self, rows: DataFrame, *, event_time: str, keys: Sequence[str], valid: Column,
                  watermark: dt.datetime) -> DataFrame:
        """Late: the row's session among the batch's rows ends before the watermark, so it extends no open session
        (Flink also counts a row whose own session closed when it bridges into an open session of an earlier batch;
        here the day's batch combine counts that one). An invalid row has no bounds: :meth:`serve` sorts it first, alone,
        so the cut is partitioned by the keys alone, as the aggregation after it is."""
        bounds = {c: F.when(F.col("_valid"), value) for c, value in self._own_session(F.col(event_time)).items()}
        cut = self.serve(rows.withColumn("_valid", valid).withColumns(bounds), keys)
        cut = cut.withColumn("_late", F.col("_valid") & ~self.is_open(watermark)).drop("_valid")
        return cut.withColumnsRenamed(dict(zip(self.bounds, _CUT, strict=True)))  # for :meth:`assign`

    def may_be_late(self, event_time: Column, watermark: dt.datetime) -> Column:
        return vs_watermark(F.unix_micros(self._own_session(event_time)["window_end"]), "<", watermark)

    def is_open(self, watermark: dt.datetime) -> Column:
        """An event at the watermark still joins a session ending there."""
        return vs_watermark(F.unix_micros(F.col("window_end")), ">=", watermark)

    def reach_of(self, changed: DataFrame, stored: Stored, keys: Sequence[str]) -> Reach:
        """The sessions the ``changed`` partial sessions reach, whole, reading only the days of stored partials they
        reach. A partial session of day d starts on d and ends before d + 1 day + gap, so sessions merged from the
        partials of days [a, b] and the changed ones are whole when each holding a changed partial starts at or after
        a + gap (no earlier day's partial can touch it) and ends before b + 1 day (nor a later one's); otherwise the
        days widen, for those sessions' keys only, and they merge again (a heavy user's session may span every day).
        Sessions holding no changed partial are the same after the change: neither read whole nor rewritten."""
        group = list(keys)
        span = changed.agg(F.min("window_start").alias("lo"), F.max("window_end").alias("hi")).first()
        if span is None or span["lo"] is None:
            return Reach(changed.limit(0), changed.select(*group, *self.bounds).limit(0))
        widen = _Widening(self, group, changed, stored, (utc(span["lo"]).date(), utc(span["hi"]).date()))
        reached, read = widen.run()
        known = read if read is not None else changed.limit(0)

        served, version = stored.served()
        touched = changed.select(*group, *self.bounds).limit(0)
        if served is not None:
            touched = persisted(_inside(served.select(*group, *self.bounds), reached, group))
            widen.cached.append(touched)
        found = reached.agg(F.min("_lo").alias("lo"), F.max("_hi").alias("hi")).first()
        prune = ("window_start", found["lo"], found["hi"]) if found is not None and found["lo"] is not None else None
        return Reach(_inside(known, reached, group), touched, prune, (widen.lo, widen.hi), version, tuple(widen.cached))

    def reach_in_state(self, changed: DataFrame, state: DataFrame, keys: Sequence[str], *, few: bool = False) -> Reach:
        """Where the state holds whole every session the ``changed`` partials can touch (Flink's MergingWindowSet):
        the ones that merge with them are the served rows replaced, as they are; nothing else is read. ``few``: the
        batch has few keys, so the state sessions of its keys are broadcast to pick the partials they may merge with."""
        group = list(keys)
        known = self.within(state, changed, group)
        reached = persisted(_holding(self, group, known, self.within(changed, F.broadcast(known) if few else known,
                                                                     group)))
        stored = persisted(_inside(known, reached, group))
        return Reach(stored, stored.select(*group, *self.bounds), cached=(reached, stored))

    def alone(self, changed: DataFrame, stored: DataFrame, keys: Sequence[str]) -> tuple[DataFrame, DataFrame] | None:
        """A batch's partial session within one day is its session's one row (a batch's rows are cut into sessions
        before they are split by day); it is served as it is when no stored session of its key is in reach (most
        sessions of a batch: each would otherwise be sorted, merged and its sketches rebuilt alone)."""
        if not keys:
            return None
        one_day = F.to_date("window_start") == F.to_date(F.col("window_end") - F.expr(f"INTERVAL {self.gap.spark}"))
        within, held = changed.where(one_day), F.broadcast(stored.select(*keys).distinct())
        rest = changed.where(~one_day).unionByName(join_on_keys(within, held, keys, "left_semi"))
        return join_on_keys(within, held, keys, "left_anti"), rest

    def next_state(self, state: DataFrame, served: DataFrame, keys: Sequence[str], columns: Sequence[str], *,
                   day: str) -> DataFrame:
        """The open sessions after a batch: the ``served`` (merged) sessions it reached, as state rows, and the
        state's sessions that none of them covers (a served one absorbed every state session it touches)."""
        group = list(keys)
        reached = _holding(self, group, state, self.within(served, state, group))  # only a state key's can cover
        covered = _inside(state, reached, group).select(*group, *self.bounds)
        kept = join_on_keys(state, covered, [*group, *self.bounds], "left_anti")
        fresh = served.withColumns({day: F.lit(None).cast("date"),  # no day: one row holds a session's days
                                    "max_event_time": F.col("window_end") - F.expr(f"INTERVAL {self.gap.seconds} SECONDS")})
        return kept.select(*columns).unionByName(fresh.select(*columns))

    # ------------------------------------------------------------------ Arrow forms
    def serve_arrow(self, rows: pa.Table, keys: Sequence[str]) -> pa.Table:
        labels = pa.array(session_labels(rows, keys))
        spans = pa.table({"s": labels, "lo": rows.column("window_start"), "hi": rows.column("window_end")}).group_by(
            "s", use_threads=False).aggregate([("lo", "min"), ("hi", "max")]).sort_by("s")
        return rows.drop_columns(list(self.bounds)).append_column("window_start", spans.column("lo_min").take(labels)) \
            .append_column("window_end", spans.column("hi_max").take(labels))

    def alone_arrow(self, changed: pa.Table, live: np.ndarray, state: pa.Table, stored: pa.Table,
                    keys: Sequence[str]) -> np.ndarray:
        """The Arrow form of :meth:`alone`: the ``live`` partial sessions within one day that merge with no ``stored``
        session (the ones in reach, or the whole state: the same answer)."""
        if not (keys and live.any()):
            return np.zeros(changed.num_rows, dtype=bool)
        start = pc.cast(pc.cast(changed.column("window_start"), TS), pa.date32())
        last = pc.cast(pc.subtract(pc.cast(changed.column("window_end"), TS),
                                   pa.scalar(dt.timedelta(seconds=self.gap.seconds))), pa.date32())
        one_day = np.asarray(pc.fill_null(pc.equal(start, last), False).to_numpy(zero_copy_only=False), dtype=bool)
        return live & one_day & ~_merged_with(changed, stored, keys)

    def is_open_arrow(self, rows: pa.Table, watermark: dt.datetime) -> pa.Array:
        return pc.greater_equal(rows.column("window_end"), pa.scalar(watermark, TS))

    def reach_in_state_arrow(self, changed: pa.Table, state: pa.Table, keys: Sequence[str]) -> pa.Table:
        """The Arrow form of :meth:`reach_in_state`: the state's sessions the ``changed`` ones merge with."""
        known = self.within_arrow(state, changed, keys)
        return known.filter(pa.array(_merged_with(known, changed, keys)))

    def next_state_arrow(self, state: pa.Table, served: pa.Table, keys: Sequence[str], *, day: str) -> pa.Table:
        """The Arrow form of :meth:`next_state` (``served``: the reached sessions as ``aggregates`` rows)."""
        kept = state.filter(pa.array(~_merged_with(state, served, keys)))
        last = pc.subtract(served.column("window_end"), pa.scalar(dt.timedelta(seconds=self.gap.seconds)))
        columns = {day: pa.nulls(served.num_rows, pa.date32()), "max_event_time": last}
        fresh = pa.table([columns[f.name] if f.name in columns else served.column(f.name) for f in state.schema],
                         names=state.schema.names)
        return pa.concat_tables([kept, fresh.cast(state.schema)])


class _Widening:
    """The days of stored partials read for a reach, widened until every session holding a changed partial is whole."""

    def __init__(self, kind: Sessions, group: list[str], changed: DataFrame, stored: Stored,
                 days: tuple[dt.date, dt.date]) -> None:
        self.kind, self.group, self.stored, self.changed = kind, group, stored, changed
        self.gap = dt.timedelta(seconds=kind.gap.seconds)
        self.pending = changed.select(*group).distinct()  # the keys whose sessions may reach past the days read
        self.lo, self.hi = days
        self.cached: list[DataFrame] = []

    def run(self) -> tuple[DataFrame, DataFrame | None]:
        """The reached sessions (key columns, ``_lo``, ``_hi``) and the stored partials read (None: none)."""
        known: DataFrame | None = None
        done: tuple[dt.date, dt.date] | None = None  # the days read so far for the pending keys
        while True:
            if (rows := self._read(done)) is not None:
                known = rows if known is None else known.unionByName(rows)
            reached = persisted(_holding(self.kind, self.group, self.changed.limit(0) if known is None else known,
                                         self.changed))
            self.cached.append(reached)
            short = self._short(reached)
            bounds = short.agg(F.min("_lo").alias("lo"), F.max("_hi").alias("hi")).first()
            if bounds is None or bounds["lo"] is None:
                return reached, known
            done, self.pending = (self.lo, self.hi), short.select(*self.group).distinct()
            first, last = utc(bounds["lo"]), utc(bounds["hi"])
            if first < _midnight(self.lo) + self.gap:
                self.lo = min(self.lo - dt.timedelta(days=1), (first - self.gap).date())
            if last >= _midnight(self.hi + dt.timedelta(days=1)):
                self.hi = max(self.hi + dt.timedelta(days=1), last.date())

    def _read(self, done: tuple[dt.date, dt.date] | None) -> DataFrame | None:
        if self.stored.days is None:  # nothing stored yet
            return None
        parts = [(self.lo, self.hi)] if done is None else [
            (self.lo, done[0] - dt.timedelta(days=1)), (done[1] + dt.timedelta(days=1), self.hi)]
        first, last = self.stored.days
        frames = [self.stored.read(max(a, first), min(b, last), F.broadcast(self.pending) if self.group else None)
                  for a, b in parts if a <= b and a <= last and b >= first]
        return functools.reduce(lambda a, b: a.unionByName(b), frames) if frames else None

    def _short(self, reached: DataFrame) -> DataFrame:
        """The reached sessions of pending keys that may reach stored partials of days not read yet."""
        first, last = self.stored.days or (self.lo, self.hi)
        earlier = (F.col("_lo") < F.lit(_midnight(self.lo) + self.gap)) if self.lo > first else F.lit(False)
        later = (F.col("_hi") >= F.lit(_midnight(self.hi + dt.timedelta(days=1)))) if self.hi < last else F.lit(False)
        short = join_on_keys(reached, self.pending, self.group, "left_semi") if self.group else reached
        short = persisted(short.where(earlier | later))
        self.cached.append(short)
        return short


def _holding(kind: Sessions, group: list[str], known: DataFrame, changed: DataFrame) -> DataFrame:
    """The sessions (key, ``_lo``, ``_hi``) the ``known`` and ``changed`` rows merge into that hold a changed one."""
    spans = [rows.select(*group, "window_start", "window_end", F.lit(live).alias("_live"))
             for rows, live in ((known, False), (changed, True))]
    sessions = kind.serve(spans[0].unionByName(spans[1]), group)
    return (sessions.groupBy(*group, "window_start", "window_end").agg(F.max("_live").alias("_live"))
            .where("_live").select(*group, F.col("window_start").alias("_lo"), F.col("window_end").alias("_hi")))


def _inside(rows: DataFrame, reached: DataFrame, group: list[str]) -> DataFrame:
    """The ``rows`` within a ``reached`` session of their key."""
    joined = join_on_keys(rows, reached, group) if group else rows.crossJoin(reached)
    return joined.where((F.col("window_start") <= F.col("_hi")) & (F.col("window_end") >= F.col("_lo"))) \
        .drop("_lo", "_hi")


def _merged_with(rows: pa.Table, changed: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """Which ``rows`` merge into a session with a ``changed`` row of their key: :meth:`Sessions.serve`, column-wise, over
    the rows of keys both hold (a batch's many sessions against the few stored ones in its reach: a few to cut)."""
    near, out = key_mask(rows, keys, changed), np.zeros(rows.num_rows, dtype=bool)  # without keys: all rows or none
    if not near.any():
        return out
    rows = rows.filter(near)
    changed = changed.filter(key_mask(changed, keys, rows))
    both = pa.concat_tables([t.select([*keys, "window_start", "window_end"]).cast(
        pa.schema([*(rows.schema.field(k) for k in keys), pa.field("window_start", TS), pa.field("window_end", TS)]))
        for t in (rows, changed)])
    labels = session_labels(both, keys)
    held = np.zeros(int(labels.max()) + 1 if len(labels) else 0, dtype=bool)
    held[labels[rows.num_rows:]] = True
    out[near] = held[labels[:rows.num_rows]]
    return out


def session_labels(rows: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """Each row's session among ``rows`` (a number), merged as :meth:`Sessions.serve` merges them: per key, sorted
    by start, a row joins the session before it when it starts at or before its latest end. Vectorised: each key's
    times are offset past the one's before it, so one running maximum of the ends serves every key."""
    n = rows.num_rows
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = pc.sort_indices(rows, [*((k, "ascending") for k in keys), ("window_start", "ascending"),
                                   ("window_end", "ascending")]).to_numpy()  # NULL keys last, by default
    ordered = rows.take(order)
    new_key = np.zeros(n, dtype=bool)
    new_key[0] = True
    for k in keys:
        column = ordered.column(k).combine_chunks()
        this, before = column.slice(1), column.slice(0, n - 1)  # NULL equals NULL and differs from a value
        differ = pc.fill_null(pc.not_equal(this, before), pc.xor(pc.is_null(this), pc.is_null(before)))
        new_key[1:] |= np.asarray(differ.to_numpy(zero_copy_only=False), dtype=bool)
    start, end = ticks(ordered.column("window_start")), ticks(ordered.column("window_end"))
    base, width = int(start.min()), int(end.max() - start.min()) + 1
    key_id = np.cumsum(new_key) - 1
    if int(key_id[-1]) * width < 2**62:
        offset = key_id * width - base
        latest = np.maximum.accumulate(end + offset)
        new = new_key.copy()
        new[1:] |= start[1:] + offset[1:] > latest[:-1]
    else:  # too many keys over too long a span for int64 offsets: the loop
        new, latest_end = new_key.copy(), end[0]
        for i in range(1, n):
            new[i] = new_key[i] or start[i] > latest_end
            latest_end = end[i] if new[i] else max(latest_end, end[i])
    labels = np.empty(n, dtype=np.int64)
    labels[order] = np.cumsum(new) - 1
    return labels


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), dt.UTC)
