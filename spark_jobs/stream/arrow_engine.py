"""The stream's driver merge engine: a mini-batch that fits in memory merged with the aggregates' Arrow algebra
(:mod:`spark_jobs.phases.arrow_merge`), Arrow in, Arrow out, no Spark job but the window kind's reach over ``partials``
where the state does not cover it; the state stays in memory between batches. The Spark engine's rules (a test holds
the two to the same tables); keys alone in a batch (most, at a realistic spread) serve as they are."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.lake import Lake, PipelineTables
from spark_jobs.lake.layout import ADOPTED, SPEC_VERSION, TS, table_schema
from spark_jobs.lake.table_rules import DAY, STREAM
from spark_jobs.phases import CompiledAggregates
from spark_jobs.phases.arrow_merge import Merged, encoded_columns, merge_groups, value_columns
from spark_jobs.phases.changelog_rule import FIRST_SEEN, ChangelogRule
from spark_jobs.stream.open_sessions import state_answers
from spark_jobs.stream.outputs import BatchOutputs, MiniBatch, stream_stamp
from spark_jobs.stream.spark_engine import NEVER as _NEVER
from spark_jobs.stream.spark_engine import partials_in_reach, served_before
from spark_jobs.windows import WindowKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["DRIVER_MAX_KEYS", "DRIVER_MAX_MERGED", "ArrowEngine", "Reached", "merge_on_driver", "partial_rows"]

DRIVER_MAX_KEYS = 2_000_000  # (day, key, window) rows of a pre-aggregated batch brought to the driver
DRIVER_MAX_MERGED = 200_000  # of those, rows merged (sketches one by one); the others serve as they are
DRIVER_MAX_STATE = 2_000_000  # state rows held in driver memory for it


@dataclass(frozen=True)
class Reached:
    """The stored rows (that count) of the served rows a batch reaches, and the served keys it rewrites."""

    stored: pa.Table
    touched: pa.Table
    read_version: int | None = None
    prune: tuple[str, Any, Any] | None = None  # where in ``aggregates`` the ``touched`` rows lie, when known


def merge_on_driver(groups: pa.Table, state: pa.Table, compiled: CompiledAggregates, *,
                    schemas: Mapping[str, pa.Schema], batch_id: int, closes: dt.datetime | None, run_id: str,
                    now: dt.datetime, batch_days: Set[dt.date] = frozenset(), batch_rows: pa.Table | None = None,
                    reached: Reached | None = None,
                    served: Callable[[pa.Table, int | None], tuple[pa.Table, int | None]] | None = None
                    ) -> BatchOutputs:
    """Merge the batch's pre-aggregated ``groups`` (state columns plus ``_first_seen``) into ``state``. ``reached``:
    the counted stored rows in the batch's reach where the state does not cover it (sessions), else the state's rows of
    days without a batch combine and the ``batch_rows`` of days with one. ``served``: the touched rows of ``aggregates``
    as they are, for the changelog's before side (else the stored rows merged)."""
    merge = _DriverMerge(compiled, schemas, run_id=run_id, now=now)
    if reached is None:  # the batch days' keys too: they are served with the batch partials that count for them
        reached = merge.reach_in_state(groups, state, batch_days, batch_rows)
    live = _live(groups, batch_days)
    quick = merge.alone(groups, live, state, reached.stored)
    rest, alone = groups.filter(pa.array(~quick)), groups.filter(pa.array(quick))
    merged = groups.filter(pa.array(live & ~quick)).select(reached.stored.column_names).cast(reached.stored.schema)
    quick_values, quick_rows = merge.rows(alone, {})
    after_values, after_rows = merge.served(pa.concat_tables([reached.stored, merged]))
    new_state = (merge.kind.next_state_arrow(state, pa.concat_tables([after_rows, quick_rows]), merge.group, day=DAY)
                 if merge.kind.state_holds_served
                 else pa.concat_tables([merge.state(state, rest), alone.select(state.column_names).cast(state.schema)]))
    if closes is not None:
        new_state = new_state.filter(merge.kind.is_open_arrow(new_state, closes))
    if compiled.retracting:
        new_state = new_state.filter(pc.not_equal(new_state.column("n_rows"), 0))
    if served is not None:
        rows, read_version = served(reached.touched, reached.read_version)
        before_values = rows.select(merge.value_schema.names).cast(merge.value_schema)
    else:
        before_values, read_version = merge.served(reached.stored)[0], reached.read_version
    first_seen = groups.group_by(merge.group, use_threads=False).aggregate([(FIRST_SEEN, "min")]).rename_columns(
        [*merge.group, FIRST_SEEN])
    return BatchOutputs(
        aggregates=pa.concat_tables([after_rows, quick_rows]),
        touched=reached.touched.cast(pa.schema([schemas["aggregates"].field(k) for k in merge.keys])),
        changelog=merge.rule.arrow(before_values, pa.concat_tables([after_values, quick_values]),
                                   first_seen, stream_stamp(batch_id, run_id), schemas["changelog"]),
        partials=partial_rows(groups, schemas["partials"], batch=f"stream-{batch_id}", run_id=run_id, now=now),
        state=new_state, read_version=read_version, prune=reached.prune)


class _DriverMerge:
    """One batch's merges on the driver, column-wise (:func:`merge_groups`), over rows the window kind serves."""

    def __init__(self, compiled: CompiledAggregates, schemas: Mapping[str, pa.Schema], *, run_id: str,
                 now: dt.datetime) -> None:
        spec = compiled.spec
        self.compiled, self.schemas, self.run_id, self.now = compiled, schemas, run_id, now
        self.kind: WindowKind = spec.window
        self.group, self.keys = list(spec.group_by), list(spec.key_columns)
        self.rule = ChangelogRule.of(spec, compiled.value_names)
        self.value_schema = pa.schema([*(schemas["aggregates"].field(c) for c in self.keys),
                                       *(schemas["aggregates"].field(n) for n in compiled.value_names),
                                       pa.field("n_rows", pa.int64())])

    def reach_in_state(self, changed: pa.Table, state: pa.Table, batch_days: Set[dt.date],
                       batch_rows: pa.Table | None) -> Reached:
        """The window kind's reach of ``changed`` in the state and, for the days with a batch combine, its partials."""
        columns = [*self.keys, "n_rows", *self.compiled.acc_columns, SPEC_VERSION]
        schema = pa.schema([self.schemas["partials"].field(c) for c in columns])
        held = self.kind.within_arrow(state, changed, self.group)  # the few rows in reach first: the state is large
        counted = [held.filter(pc.invert(_in_days(held, batch_days))).select(columns).cast(schema)]
        if batch_rows is not None:
            counted.append(self.kind.within_arrow(batch_rows, changed, self.group).select(columns).cast(schema))
        return Reached(pa.concat_tables(counted), self.kind.touched_arrow(changed, self.group))

    def alone(self, groups: pa.Table, live: np.ndarray, state: pa.Table, stored: pa.Table) -> np.ndarray:
        """The batch's rows that the window kind serves as they are: their served row and ``+I`` are the row itself
        (and so is their state row); never under retractions, where a row may cancel out."""
        if self.compiled.retracting:
            return np.zeros(groups.num_rows, dtype=bool)
        return self.kind.alone_arrow(groups, live, state, stored, self.group)

    def served(self, stored: pa.Table) -> tuple[pa.Table, pa.Table]:
        """The served rows the ``stored`` rows merge into, as :meth:`rows`."""
        return self.rows(*merge_groups(self.kind.serve_arrow(stored, self.group), self.keys, self.compiled.entries))

    def rows(self, rows: pa.Table, accs: Merged) -> tuple[pa.Table, pa.Table]:
        """The values (for the changelog) and the ``aggregates`` rows (those that exist) of served ``rows`` whose
        merged accumulators are ``accs`` (else their columns)."""
        rows = rows if SPEC_VERSION in rows.column_names else rows.append_column(
            SPEC_VERSION, pa.nulls(rows.num_rows, pa.int64()))
        rows = rows.set_column(rows.schema.get_field_index(SPEC_VERSION), SPEC_VERSION,
                               pc.fill_null(rows.column(SPEC_VERSION), ADOPTED))
        entries, coverage, schema = self.compiled.entries, self.compiled.coverage, self.schemas["aggregates"]
        values = {**{k: rows.column(k) for k in self.keys}, **value_columns(rows, accs, entries, coverage),
                  "n_rows": rows.column("n_rows")}
        out = {**values, **encoded_columns(rows, accs, entries, schema, coverage),
               "updated_at": pa.repeat(pa.scalar(self.now, TS), rows.num_rows),
               "run_id": pa.repeat(pa.scalar(self.run_id), rows.num_rows), SPEC_VERSION: rows.column(SPEC_VERSION)}
        table = pa.table([out[f.name].cast(f.type) for f in schema], schema=schema)
        exists = table.filter(pc.not_equal(table.column("n_rows"), 0)) if self.compiled.retracting else table
        return pa.table([values[f.name].cast(f.type) for f in self.value_schema], schema=self.value_schema), exists

    def state(self, state: pa.Table, rest: pa.Table) -> pa.Table:
        """The state without the stored rows ``rest`` touches, and those merged with ``rest`` once."""
        day_keys = [DAY, *self.group]
        touched = self.kind.within_arrow(state, rest, day_keys)
        both = pa.concat_tables([touched, rest.select(state.column_names).cast(state.schema)])
        rows, accs = merge_groups(both, [*day_keys, *self.kind.bounds], self.compiled.entries,
                                  [("max_event_time", "max")])
        columns = encoded_columns(rows, accs, self.compiled.entries, state.schema, self.compiled.coverage)
        merged = pa.table([(columns[f.name] if f.name in columns else rows.column(f.name)).cast(f.type)
                           for f in state.schema], schema=state.schema)
        return pa.concat_tables([self.kind.within_arrow(state, rest, day_keys, anti=True), merged])


def _live(groups: pa.Table, batch_days: Set[dt.date]) -> np.ndarray:
    """The batch's rows of days without a batch combine: the ones it merges (the others count from batch partials)."""
    return np.asarray(pc.invert(_in_days(groups, batch_days)).to_numpy(zero_copy_only=False), dtype=bool)


def _in_days(table: pa.Table, days: Set[dt.date]) -> pa.Array:
    return pc.fill_null(pc.is_in(table.column(DAY), pa.array(sorted(days), pa.date32())), False)


def partial_rows(groups: pa.Table, schema: pa.Schema, *, batch: str, run_id: str, now: dt.datetime) -> pa.Table:
    """The batch's pre-aggregated rows as ``partials`` rows (source ``stream``), like ``batch_columns``."""
    constants = {"batch": batch, "source": STREAM, "run_id": run_id, "created_at": now}
    arrays = [pa.repeat(pa.scalar(constants[f.name], f.type), groups.num_rows) if f.name in constants
              else groups.column(f.name).cast(f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


class ArrowEngine:
    """Merges on the driver; keeps the state it committed in memory while the table has not moved on."""

    def __init__(self, spark: SparkSession, compiled: CompiledAggregates, lake: Lake,
                 max_keys: int = DRIVER_MAX_KEYS) -> None:
        self.spark, self.compiled, self.lake, self.max_keys = spark, compiled, lake, max_keys
        spec = compiled.spec
        self.kind, self.group, self.keys = spec.window, list(spec.group_by), list(spec.key_columns)
        self.tables = PipelineTables(spec.lake, spec.name)
        self.partial_columns = [*self.keys, "n_rows", *compiled.acc_columns, SPEC_VERSION]
        self._held: tuple[int | None, pa.Table] | None = None  # (state version, its rows)
        self._cached: list[DataFrame] = []

    def fits(self, batch: MiniBatch, keys: int) -> bool:
        """Whether a batch of ``keys`` pre-aggregated rows merges here: not too many, a state small enough, and at
        most ``DRIVER_MAX_MERGED`` of them merged. Past that many rows, the batch must be on the driver,
        and its rows that the window kind would not serve as they are beside the whole state are counted (the state
        holds what a batch reaches, but for the closed sessions a late row reaches: an estimate, not a bound)."""
        if keys > self.max_keys or sum(
                f.num_records or 0 for f in self.lake.files(self.tables.stream_state)) > DRIVER_MAX_STATE:
            return False
        if keys <= DRIVER_MAX_MERGED:
            return True
        if batch.collected is None or self.compiled.retracting:
            return False
        stored = self._schemas()["state"]
        state, groups = self._state(stored), batch.collected.select(stored.names).cast(stored)
        alone = self.kind.alone_arrow(groups, _live(groups, batch.batch_days), state, state, self.group)
        return keys - int(alone.sum()) <= DRIVER_MAX_MERGED

    def merge(self, batch: MiniBatch) -> BatchOutputs:
        schemas = self._schemas()
        stored = schemas["state"]
        rows = batch.collected if batch.collected is not None else batch.groups.toArrow()
        groups = rows.select([*stored.names, FIRST_SEEN]).cast(pa.schema([*stored, pa.field(
            FIRST_SEEN, stored.field("max_event_time").type)]))
        batch_rows = self.lake.read_files(self.tables.partials, list(batch.batch_files)).select(
            *self.partial_columns).toArrow() if batch.batch_files else None
        state = self._state(stored)
        reached = None if self.kind.state_covers_reach else self._reach(batch, groups, state, schemas)
        return merge_on_driver(groups, state, self.compiled, schemas=schemas,
                               batch_id=batch.batch_id, closes=batch.closes, run_id=batch.run_id,
                               now=dt.datetime.now(dt.UTC), batch_days=batch.batch_days, batch_rows=batch_rows,
                               reached=reached, served=self._served if batch.batch_days else None)

    def _served(self, touched: pa.Table, version: int | None) -> tuple[pa.Table, int | None]:
        """The touched rows of ``aggregates`` as they are (:func:`served_before`), on the driver."""
        none = table_schema(self.compiled.spec, "aggregates").empty_table()
        if not touched.num_rows:
            return none, version
        rows, version = served_before(self.lake, self.tables, self.spark.createDataFrame(touched), version)
        return (none if rows is None else rows.toArrow()), version

    def after_commit(self, state_version: int | None, outputs: BatchOutputs) -> None:
        assert isinstance(outputs.state, pa.Table)
        self._held = (state_version, outputs.state)
        for df in self._cached:
            df.unpersist()
        self._cached = []

    def _schemas(self) -> dict[str, pa.Schema]:
        """Each output table's columns: as it is, or as its layout makes it for a table the batch creates."""
        t, spec = self.tables, self.compiled.spec
        return {name: self.lake.schema(path) or table_schema(spec, name) for name, path in (
            ("aggregates", t.aggregates), ("changelog", t.changelog), ("partials", t.partials),
            ("state", t.stream_state))}

    def _reach(self, batch: MiniBatch, groups: pa.Table, state: pa.Table, schemas: Mapping[str, pa.Schema]) -> Reached:
        """The Arrow form of the Spark engine's ``_reach`` for a kind whose reach the state does not cover."""
        stored_schema = pa.schema([schemas["partials"].field(c) for c in self.partial_columns])
        if not state_answers(self.kind, batch, self.lake, self.tables, state):
            changed = groups.select(self.partial_columns)
            if self.kind.state_holds_served:  # per-day rows: their sessions are merged whole from partials
                older = state.filter(pc.is_valid(state.column(DAY))).select(self.partial_columns)
                changed = pa.concat_tables([changed, older.cast(changed.schema)])
            return self._reach_in_partials(batch, changed, stored_schema)
        stored = self.kind.reach_in_state_arrow(groups, state, self.group)
        ends = stored.column("window_end")
        prune = ("window_end", pc.min(ends).as_py(), pc.max(ends).as_py()) if stored.num_rows else (
            "window_end", _NEVER, _NEVER)
        return Reached(stored.select(self.partial_columns).cast(stored_schema), stored.select(self.keys), prune=prune)

    def _reach_in_partials(self, batch: MiniBatch, groups: pa.Table, stored_schema: pa.Schema) -> Reached:
        """The window kind's reach of the batch's rows over ``partials`` (in Spark), brought to the driver."""
        if not groups.num_rows:
            return Reached(stored_schema.empty_table(), groups.select(self.keys))
        reach = self.kind.reach_of(self.spark.createDataFrame(groups.select(self.partial_columns).cast(stored_schema)),
                                   partials_in_reach(self.lake, self.tables, batch), self.group)
        self._cached += reach.cached
        touched = reach.touched.toArrow() if reach.touched is not None else groups.select(self.keys).slice(0, 0)
        return Reached(reach.stored.select(*self.partial_columns).toArrow().cast(stored_schema), touched,
                       reach.read_version)

    def _state(self, schema: pa.Schema) -> pa.Table:
        if (version := self.lake.version(self.tables.stream_state)) is None:
            return schema.empty_table()
        if self._held is None or self._held[0] != version:
            self._held = (version, self.lake.read(self.tables.stream_state).toArrow().select(schema.names).cast(schema))
        return self._held[1]
