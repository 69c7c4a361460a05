"""The stream's Spark merge engine: for batches too large for the driver (and the first one).

Each touched key's state is read once, merged once with the batch's pre-aggregated rows and
written once; the touched keys' values before and after come from one aggregation.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_jobs.jobs.combine import batch_columns
from spark_jobs.jobs.reduce import reduce
from spark_jobs.lake import Lake, PipelineTables
from spark_jobs.lake.layout import SPEC_VERSION
from spark_jobs.lake.table_rules import DAY, STREAM, counted_files
from spark_jobs.phases import CompiledAggregates, final_aggregate
from spark_jobs.phases.compiled import merge_sessions
from spark_jobs.spec import PipelineSpec
from spark_jobs.stream.outputs import BatchOutputs, MiniBatch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SessionEngine", "SessionReach", "SparkEngine", "changelog_rows", "sessions_in_reach"]


def changelog_rows(before: DataFrame, after: DataFrame, first_seen: DataFrame, compiled: CompiledAggregates,
                   batch_id: int) -> DataFrame:
    """Pure transform: each key's values before and after a batch -> its +I/-U/+U/-D rows.

    A new key gives ``+I``; a changed key ``-U`` (old values) then ``+U`` (new values); a key
    whose row count falls to zero ``-D``; an unchanged key nothing. A key that is missing or
    has a row count of zero does not exist. ``seq`` orders the rows within the batch: keys by
    their first event in the batch, then by key.

    A session is named by its group key and start: one that grew keeps its name (``-U`` with its old
    end, ``+U`` with its new one); one absorbed by another, or whose start a merge moved, is deleted
    (``-D``) and the merged session inserted or updated under its own start.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spec = compiled.spec
    sessions = spec.window is not None and spec.window.session
    keys = [*spec.group_by, "window_start"] if sessions else list(spec.key_columns)
    names = (["window_end"] if sessions else []) + compiled.value_names
    old = before.select(*keys, F.struct(*names, "n_rows").alias("_old"))
    new = after.select(*keys, F.struct(*names, "n_rows").alias("_new"))
    both = old.join(new, keys, "full_outer")
    both = both.join(first_seen, list(spec.group_by), "left") if sessions and spec.group_by else (
        both.crossJoin(first_seen) if sessions else both.join(first_seen, keys, "left"))
    same = F.lit(True)
    for name in names:
        same = same & F.col(f"_old.{name}").eqNullSafe(F.col(f"_new.{name}"))

    def entry(op: str, order: int, values: str) -> Any:
        return F.struct(F.lit(op).alias("op"), F.lit(order).alias("_order"),
                        *(F.col(f"{values}.{n}").alias(n) for n in names))

    was = F.col("_old").isNotNull() & (F.col("_old.n_rows") != 0)
    gone = F.col("_new").isNull() | (F.col("_new.n_rows") == 0)
    ops = (F.when(~was & ~gone, F.array(entry("+I", 0, "_new")))
           .when(was & gone, F.array(entry("-D", 0, "_old")))
           .when(was & ~same, F.array(entry("-U", 0, "_old"), entry("+U", 1, "_new")))
           .otherwise(F.array()))
    rows = both.select(*keys, "_first_seen", F.explode(ops).alias("_c")).select(*keys, "_first_seen", "_c.*")
    order = Window.orderBy(F.col("_first_seen").asc_nulls_last(), *keys, "_order")
    return rows.select("op", *spec.key_columns, *compiled.value_names, F.lit(batch_id).cast("bigint").alias("batch_id"),
                       (F.row_number().over(order) - 1).cast("bigint").alias("seq"))


class SparkEngine:
    """Merges in Spark; its outputs are DataFrames (persisted ones are released by ``committed``)."""

    name = "spark"

    def __init__(self, spark: SparkSession, compiled: CompiledAggregates, lake: Lake) -> None:
        self.spark, self.compiled, self.lake = spark, compiled, lake
        spec = compiled.spec
        self.tables = PipelineTables(spec.lake, spec.name)
        self.keys = list(spec.key_columns)
        self.state_keys = [DAY, *self.keys]
        self.state_columns = [*self.state_keys, "n_rows", *compiled.acc_columns, "max_event_time", SPEC_VERSION]
        self._cached: list[DataFrame] = []

    def accepts(self, keys: int) -> bool:
        return True

    def merge(self, batch: MiniBatch) -> BatchOutputs:
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        compiled, keys = self.compiled, self.keys
        delta = batch.delta
        touched_days = delta.select(*self.state_keys)
        touched = delta.select(*keys).distinct()
        first_seen = delta.groupBy(*keys).agg(F.min("_first_seen").alias("_first_seen"))
        delta_state = delta.select(*self.state_columns)
        state = (self.lake.read(self.tables.stream_state) if self.lake.version(self.tables.stream_state) is not None
                 else self.spark.createDataFrame([], delta_state.schema))
        # one state read per touched key ...
        key_rows = state.join(touched, keys, "left_semi").persist(StorageLevel.MEMORY_AND_DISK)
        merged = final_aggregate(key_rows.join(touched_days, self.state_keys, "left_semi").unionByName(delta_state),
                                 compiled, extra_keys=[DAY], extra_aggs=[F.max("max_event_time").alias("max_event_time")])
        merged = merged.select(*self.state_columns).persist(StorageLevel.MEMORY_AND_DISK)
        self._cached += [key_rows, merged]
        new_key_rows = key_rows.join(touched_days, self.state_keys, "left_anti").unionByName(merged)

        # the touched keys' values before and after, in one aggregation
        sides = key_rows.withColumn("_after", F.lit(False)).unionByName(new_key_rows.withColumn("_after", F.lit(True)))
        values = final_aggregate(sides, compiled, extra_keys=["_after"])
        changes = changelog_rows(values.where(~F.col("_after")).drop("_after"),
                                 values.where(F.col("_after")).drop("_after"), first_seen, compiled, batch.batch_id)
        # ... and one state write per touched key; closed windows leave
        new_state = state.join(touched_days, self.state_keys, "left_anti").unionByName(merged)
        if batch.closes is not None:
            new_state = new_state.where(F.col("window_end") > F.lit(batch.closes))
        if compiled.retracting:  # every row of that day and key was retracted
            new_state = new_state.where(F.col("n_rows") != 0)
        return BatchOutputs(
            aggregates=reduce(self._hybrid_inputs(new_key_rows, touched, batch), compiled, run_id=batch.run_id),
            touched=touched,
            changelog=changes,
            partials=batch_columns(delta.select(*self.state_columns).drop("max_event_time"), batch=batch.name,
                                   source=STREAM, event_date=F.col(DAY), run_id=batch.run_id),
            state=new_state,
        )

    def committed(self, state_version: int | None, outputs: BatchOutputs) -> None:
        for df in self._cached:
            df.unpersist()
        self._cached = []

    def _hybrid_inputs(self, key_rows: DataFrame, touched: DataFrame, batch: MiniBatch) -> DataFrame:
        """The partial rows that count for the touched keys: their state rows of days without a batch
        combine, and the batch partials of days with one."""
        from pyspark.sql import functions as F

        columns = [*self.keys, "n_rows", *self.compiled.acc_columns, SPEC_VERSION]
        if not batch.batch_days:
            return key_rows.select(*columns)
        live = key_rows.where(~F.col(DAY).isin(sorted(batch.batch_days))).select(*columns)
        if not batch.batch_files:
            return live
        counted = self.lake.read_files(self.tables.partials, list(batch.batch_files)).join(touched, self.keys,
                                                                                            "left_semi")
        return live.unionByName(counted.select(*columns))


@dataclass(frozen=True)
class SessionReach:
    """What a mini-batch's partial sessions reach: the sessions (after it) that hold a live partial, whole."""

    stored: DataFrame  # the counted partial sessions, without the batch's own, of the sessions it reaches
    served: DataFrame  # key columns of the served sessions those replace, at ``read_version`` of aggregates
    read_version: int | None
    cached: tuple[DataFrame, ...] = ()  # released once the batch commits


def sessions_in_reach(lake: Lake, tables: PipelineTables, spec: PipelineSpec, batch: MiniBatch,
                      live: DataFrame) -> SessionReach:
    """Read only the days of partials that the batch's sessions reach, not every day of the keys it touched.

    A partial session of day d starts on d and ends before d + 1 day + gap. So sessions merged from the
    partials of days [a, b] and the live ones are whole when each that holds a live partial starts at or after
    a + gap (no partial of an earlier day can touch it) and ends before b + 1 day (nor of a later one);
    otherwise the days widen, for the keys of those sessions only, and they merge again (a heavy user's
    session may span every day). Sessions without a live partial are the same before and after the batch:
    they give no changelog row and are not rewritten."""
    from pyspark.sql import functions as F

    assert spec.window is not None and spec.window.gap is not None
    group, gap = list(spec.group_by), dt.timedelta(seconds=spec.window.gap.seconds)
    files = counted_files(lake.files(tables.partials))
    day_of = {p: dt.date.fromisoformat(d) for p, f in files.items() if (d := f.partition_values.get(DAY))}
    days = sorted(set(day_of.values()))
    spans = live.select(*group, "window_start", "window_end", F.lit(True).alias("_live"))
    pending = live.select(*group).distinct()  # the keys whose sessions may reach further than the days read
    stored: DataFrame | None = None
    done: tuple[dt.date, dt.date] | None = None  # the days read so far for the pending keys
    lo, hi = batch.span[0].date(), batch.span[1].date()
    cached: list[DataFrame] = []
    while True:
        paths = [p for p, day in day_of.items() if lo <= day <= hi and not (done and done[0] <= day <= done[1])]
        if paths:
            rows = lake.read_files(tables.partials, paths).where(F.col("batch") != F.lit(batch.name))
            rows = rows.join(F.broadcast(pending), group, "left_semi") if group else rows
            stored = rows if stored is None else stored.unionByName(rows)
        known = live.limit(0) if stored is None else stored  # (live has the columns of partials, and more)
        sessions = merge_sessions(known.select(*group, "window_start", "window_end", F.lit(False).alias("_live"))
                                  .unionByName(spans), spec)
        reached = (sessions.groupBy(*group, "window_start", "window_end").agg(F.max("_live").alias("_live"))
                   .where("_live").select(*group, F.col("window_start").alias("_lo"), F.col("window_end").alias("_hi"))
                   .persist())
        cached.append(reached)
        earlier = (F.col("_lo") < F.lit(_midnight(lo) + gap)) if days and lo > days[0] else F.lit(False)
        later = (F.col("_hi") >= F.lit(_midnight(hi + dt.timedelta(days=1)))) if days and hi < days[-1] else F.lit(False)
        short = reached.join(pending, group, "left_semi") if group else reached
        short = short.where(earlier | later).persist()
        cached.append(short)
        bounds = short.agg(F.min("_lo").alias("lo"), F.max("_hi").alias("hi")).first()
        assert bounds is not None
        if bounds["lo"] is None:
            break
        first, last = _utc(bounds["lo"]), _utc(bounds["hi"])
        done, pending = (lo, hi), short.select(*group).distinct()
        if first < _midnight(lo) + gap:
            lo = min(lo - dt.timedelta(days=1), (first - gap).date())
        if last >= _midnight(hi + dt.timedelta(days=1)):
            hi = max(hi + dt.timedelta(days=1), last.date())

    def within(rows: DataFrame) -> DataFrame:
        joined = rows.join(reached, group) if group else rows.crossJoin(reached)
        return joined.where((F.col("window_start") <= F.col("_hi")) & (F.col("window_end") >= F.col("_lo"))) \
            .drop("_lo", "_hi")

    version = lake.version(tables.aggregates)
    served = live.select(*spec.key_columns).limit(0)
    if version is not None:
        served = within(lake.read(tables.aggregates, version=version).select(*spec.key_columns)).persist()
        cached.append(served)
    return SessionReach(stored=within(known), served=served, read_version=version, cached=tuple(cached))


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(), dt.UTC)


def _utc(value: Any) -> Any:
    """Spark returns naive datetimes in the driver's zone."""
    return value.astimezone(dt.UTC) if isinstance(value, dt.datetime) else value


class SessionEngine(SparkEngine):
    """Merges session windows in Spark: a batch's partial sessions with the partial sessions that count (the
    hybrid rule) of the sessions they reach, as the reduce merges them, so a late event that bridges two served
    sessions merges them. The state keeps each key's open sessions per event day (for the watermark, and to
    inspect); the sessions before and after come from ``partials`` without this batch's own rows, so a replay
    after a crash derives the same changelog."""

    def __init__(self, spark: SparkSession, compiled: CompiledAggregates, lake: Lake) -> None:
        super().__init__(spark, compiled, lake)
        self.group = list(compiled.spec.group_by)
        self.partial_columns = [*self.keys, "n_rows", *compiled.acc_columns, SPEC_VERSION]

    def merge(self, batch: MiniBatch) -> BatchOutputs:
        from pyspark.sql import functions as F

        compiled, group = self.compiled, self.group
        delta = batch.delta
        touched = delta.select(*group).distinct() if group else None
        first_seen = delta.groupBy(*group).agg(F.min("_first_seen").alias("_first_seen"))
        live = delta.where(~F.col(DAY).isin(sorted(batch.batch_days))) if batch.batch_days else delta
        reach = sessions_in_reach(self.lake, self.tables, compiled.spec, batch, live)
        self._cached += reach.cached
        stored = reach.stored.select(*self.partial_columns)
        before = reduce(stored, compiled, run_id=batch.run_id)
        after = reduce(stored.unionByName(live.select(*self.partial_columns)), compiled, run_id=batch.run_id)
        state = (self.lake.read(self.tables.stream_state) if self.lake.version(self.tables.stream_state) is not None
                 else self.spark.createDataFrame([], delta.select(*self.state_columns).schema))
        opened = merge_sessions(self._of_touched(state, touched).select(*self.state_columns).unionByName(
            delta.select(*self.state_columns)), compiled.spec, extra_keys=[DAY])
        merged = final_aggregate(opened, compiled, extra_keys=[DAY],
                                 extra_aggs=[F.max("max_event_time").alias("max_event_time")]).select(*self.state_columns)
        kept = state.join(touched, group, "left_anti") if touched is not None else state.limit(0)
        new_state = kept.select(*self.state_columns).unionByName(merged)
        if batch.closes is not None:  # an event at the watermark still joins a session ending there
            new_state = new_state.where(F.col("window_end") >= F.lit(batch.closes))
        return BatchOutputs(
            aggregates=after, touched=reach.served,
            changelog=changelog_rows(before, after, first_seen, compiled, batch.batch_id),
            partials=batch_columns(delta.select(*self.state_columns).drop("max_event_time"), batch=batch.name,
                                   source=STREAM, event_date=F.col(DAY), run_id=batch.run_id),
            state=new_state, read_version=reach.read_version)

    def _of_touched(self, rows: DataFrame, touched: DataFrame | None) -> DataFrame:
        return rows.join(touched, self.group, "left_semi") if touched is not None else rows
