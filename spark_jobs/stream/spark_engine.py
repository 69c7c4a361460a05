"""The stream's Spark merge engine, for batches too large for the driver: the window kind's rules as DataFrames.
Each stored row the batch touches is read from the state once, merged once with the batch's rows and written once;
the served rows the batch reaches give their values before and after in one aggregation, and the changelog between."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from spark_jobs.jobs.combine import batch_columns
from spark_jobs.jobs.reduce import served_rows
from spark_jobs.key_match import join_on_keys
from spark_jobs.lake import Lake, PipelineTables
from spark_jobs.lake.layout import SPEC_VERSION
from spark_jobs.lake.table_rules import DAY, STREAM, counted_files
from spark_jobs.persisted import persisted
from spark_jobs.phases import CompiledAggregates, final_aggregate
from spark_jobs.phases.changelog_rule import FIRST_SEEN, ChangelogRule
from spark_jobs.spark_functions import F
from spark_jobs.stream.open_sessions import state_answers
from spark_jobs.stream.outputs import BatchOutputs, MiniBatch, stream_stamp
from spark_jobs.windows import Reach, Stored

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

NEVER = dt.datetime(1, 1, 1, tzinfo=dt.UTC)  # a prune range no row is in: the batch replaces no served row
SMALL_ROWS = 200_000  # a batch's group keys, and its served rows before, that its joins broadcast

__all__ = ["NEVER", "SparkEngine", "partials_in_reach", "served_before", "state_in_reach"]


class SparkEngine:
    """Merges in Spark; its outputs are DataFrames (the persisted ones are released after the commit)."""

    def __init__(self, spark: SparkSession, compiled: CompiledAggregates, lake: Lake) -> None:
        self.spark, self.compiled, self.lake = spark, compiled, lake
        spec = compiled.spec
        self.kind, self.group = spec.window, list(spec.group_by)
        self.tables = PipelineTables(spec.lake, spec.name)
        self.day_keys = [DAY, *self.group]
        self.state_columns = [DAY, *spec.key_columns, "n_rows", *compiled.acc_columns, "max_event_time", SPEC_VERSION]
        self.partial_columns = [*spec.key_columns, "n_rows", *compiled.acc_columns, SPEC_VERSION]
        self.rule = ChangelogRule.of(spec, compiled.value_names)
        self._cached: list[DataFrame] = []

    def merge(self, batch: MiniBatch) -> BatchOutputs:
        groups = batch.groups
        state = (self.lake.read(self.tables.stream_state) if self.lake.version(self.tables.stream_state) is not None
                 else self.spark.createDataFrame([], groups.select(*self.state_columns).schema))
        live = groups.where(~F.col(DAY).isin(sorted(batch.batch_days))) if batch.batch_days else groups
        first_seen = self._cache(groups.groupBy(*self.group).agg(F.min(FIRST_SEEN).alias(FIRST_SEEN)))
        few = first_seen.count() <= SMALL_ROWS  # few group keys: the rows keyed by them are broadcast to the batch's
        reach, prune = self._reach(batch, groups.select(*self.partial_columns), state, few)
        self._cached += reach.cached
        values = self._values(reach, live)
        after = values.where(F.col("_after")).drop("_after")
        # whole open sessions: the batch's merged ones in (a closed one would leave), the ones they absorbed out (a
        # closed one's are closed too); else stored rows merged
        opened = after if batch.closes is None else after.where(self.kind.is_open(batch.closes))
        new_state = (self.kind.next_state(state, opened, self.group, self.state_columns, day=DAY)
                     if self.kind.state_holds_served else self._state(state, groups))
        if batch.closes is not None:  # closed windows leave
            new_state = new_state.where(self.kind.is_open(batch.closes))
        if self.compiled.retracting:  # every row of that day and key was retracted
            new_state = new_state.where(F.col("n_rows") != 0)
        if self.kind.state_holds_served:
            new_state = self._cache(new_state)
        before, read_version = values.where(~F.col("_after")).drop("_after"), reach.read_version
        if batch.batch_days:  # the served rows as they are: a batch combine's partials may not be reduced yet
            served, read_version = served_before(self.lake, self.tables, reach.touched, read_version)
            before = before.limit(0) if served is None else served
        small = few and not batch.batch_days and before.count() <= SMALL_ROWS
        return BatchOutputs(
            aggregates=served_rows(after.where(F.col("n_rows") != 0) if self.compiled.retracting else after,
                                   run_id=batch.run_id),
            touched=reach.touched,
            changelog=self.rule.spark(before, after, first_seen, stream_stamp(batch.batch_id, batch.run_id),
                                      small=small),
            partials=batch_columns(groups.select(*self.state_columns).drop("max_event_time"), batch=batch.name,
                                   source=STREAM, event_date=F.col(DAY), run_id=batch.run_id),
            state=new_state, read_version=read_version, prune=prune)

    def after_commit(self, state_version: int | None, outputs: BatchOutputs) -> None:
        for df in self._cached:
            df.unpersist()
        self._cached = []

    def _reach(self, batch: MiniBatch, changed: DataFrame, state: DataFrame, few: bool
               ) -> tuple[Reach, tuple[str, Any, Any] | None]:
        """The stored rows the batch reaches (with the batch days' keys, served with the batch partials that count for
        them), and where in ``aggregates`` the replaced rows lie, when known. Sessions: the state's whole sessions where
        it answers (:mod:`~spark_jobs.stream.open_sessions`), else ``partials`` and the state's per-day rows."""
        if self.kind.state_covers_reach:
            return self.kind.reach_of(changed, state_in_reach(self.lake, self.tables, batch, state), self.group), None
        if state_answers(self.kind, batch, self.lake, self.tables, state):
            reach = self.kind.reach_in_state(changed, state, self.group, few=few)
            ends = reach.stored.agg(F.min("window_end").alias("lo"), F.max("window_end").alias("hi")).first()
            return reach, ("window_end", ends["lo"], ends["hi"]) if ends is not None and ends["lo"] is not None else (
                "window_end", NEVER, NEVER)
        if self.kind.state_holds_served:  # state rows of the older per-day form: their sessions merge whole
            changed = changed.unionByName(state.where(F.col(DAY).isNotNull()).select(*self.partial_columns))
        return self.kind.reach_of(changed, partials_in_reach(self.lake, self.tables, batch), self.group), None

    def _cache(self, frame: DataFrame) -> DataFrame:
        """Persisted until the batch commits (:meth:`after_commit` releases it)."""
        frame = persisted(frame)
        self._cached.append(frame)
        return frame

    def _values(self, reach: Reach, live: DataFrame) -> DataFrame:
        """The served rows the batch reaches, before (``_after`` false) and after it, in one aggregation."""
        before, live = reach.stored.select(*self.partial_columns), live.select(*self.partial_columns)
        apart = self.kind.alone(live, before, self.group)
        alone, live = apart if apart is not None else (None, live)
        sides = before.withColumn("_after", F.lit(False)).unionByName(
            before.unionByName(live).withColumn("_after", F.lit(True)))
        values = final_aggregate(self.kind.serve(sides, ["_after", *self.group]), self.compiled, extra_keys=["_after"])
        if alone is not None:
            values = values.unionByName(final_aggregate(alone.withColumn("_after", F.lit(True)), self.compiled,
                                                        extra_keys=["_after"], alone=True))
        return self._cache(values)

    def _state(self, state: DataFrame, groups: DataFrame) -> DataFrame:
        """The new state: the stored rows the batch touches merged with its rows once."""
        touched = self.kind.within(state, groups, self.day_keys).select(*self.state_columns)
        stored = self.kind.merge_stored(touched.unionByName(groups.select(*self.state_columns)), self.day_keys)
        merged = final_aggregate(stored, self.compiled, extra_keys=[DAY],
                                 extra_aggs={"max_event_time": F.max("max_event_time")})
        merged = self._cache(merged.select(*self.state_columns))
        return self.kind.within(state, groups, self.day_keys, anti=True).select(*self.state_columns).unionByName(merged)


def served_before(lake: Lake, tables: PipelineTables, touched: DataFrame | None, version: int | None
                  ) -> tuple[DataFrame | None, int | None]:
    """The ``touched`` rows of ``aggregates`` as they are (at ``version``, else the latest; None: no table yet), and
    the version read: the changelog's before side where the batch reaches days a batch combine wrote, whose batch
    partials ``aggregates`` holds only once a reduce (or this batch) merged them."""
    version = lake.version(tables.aggregates) if version is None else version
    if version is None:
        return None, None
    rows = lake.read(tables.aggregates, version=version)
    if touched is not None:
        rows = join_on_keys(rows, touched, touched.columns, "left_semi")
    return rows, version


def state_in_reach(lake: Lake, tables: PipelineTables, batch: MiniBatch, state: DataFrame) -> Stored:
    """The stored rows that count (the hybrid rule): the state's, and the batch partials of days a batch combined."""
    counted = state.where(~F.col(DAY).isin(sorted(batch.batch_days))) if batch.batch_days else state
    if batch.batch_files:
        counted = counted.drop("max_event_time").unionByName(
            lake.read_files(tables.partials, list(batch.batch_files)), allowMissingColumns=True)

    def read(lo: dt.date | None, hi: dt.date | None, keys: DataFrame | None) -> DataFrame:
        rows = counted.where(F.col(DAY).between(F.lit(lo), F.lit(hi))) if lo is not None and hi is not None else counted
        return rows if keys is None else join_on_keys(rows, keys, keys.columns, "left_semi")

    return Stored(read, None, lambda: (None, None))


def partials_in_reach(lake: Lake, tables: PipelineTables, batch: MiniBatch) -> Stored:
    """The stored rows that count, from ``partials`` (the hybrid rule: its counted files), without the batch's own
    rows (a replay finds them committed), and the served keys of ``aggregates`` as they are now."""
    files = counted_files(lake.files(tables.partials)) if lake.version(tables.partials) is not None else {}
    day_of = {p: dt.date.fromisoformat(d) for p, f in files.items() if (d := f.partition_values.get(DAY))}
    def read(lo: dt.date | None, hi: dt.date | None, keys: DataFrame | None) -> DataFrame:
        paths = [p for p, day in day_of.items() if (lo is None or lo <= day) and (hi is None or day <= hi)]
        rows = lake.read_files(tables.partials, paths).where(F.col("batch") != F.lit(batch.name))
        return rows if keys is None else join_on_keys(rows, keys, keys.columns, "left_semi")

    days = (min(day_of.values()), max(day_of.values())) if day_of else None
    return Stored(read, days, lambda: served_before(lake, tables, None, None))
