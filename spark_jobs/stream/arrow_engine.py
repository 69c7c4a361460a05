"""The stream's driver merge engine: a small mini-batch merged with the aggregates' Python
algebra, Arrow in, Arrow out, no Spark job.

Planning and scheduling a merge's Spark jobs costs seconds, merging a few thousand keys
milliseconds; the state of open windows stays in memory between batches. The rules are those
of :mod:`spark_jobs.stream.spark_engine` (a test holds the two to byte-identical tables): each
touched (day, key) state row is merged once with the batch's pre-aggregated row; the changelog
compares each touched key's state value before and after; a key's ``aggregates`` row merges the
partials that count (the hybrid rule); closed windows leave state.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence, Set
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.lake import Lake, PipelineTables
from spark_jobs.lake.arrow import key_mask
from spark_jobs.lake.layout import ADOPTED, SPEC_VERSION, TS, table_schema
from spark_jobs.lake.table_rules import DAY, STREAM
from spark_jobs.phases import CompiledAggregates
from spark_jobs.phases.arrow_merge import encoded_columns, value_columns
from spark_jobs.phases.python_merge import LocalAggregates
from spark_jobs.stream.outputs import BatchOutputs, MiniBatch

__all__ = ["DRIVER_MAX_KEYS", "DriverEngine", "merge_on_driver", "partial_rows", "same_values"]

DRIVER_MAX_KEYS = 200_000  # (day, key, window) rows of a pre-aggregated batch merged on the driver
DRIVER_MAX_STATE = 2_000_000  # state rows held in driver memory for it


def merge_on_driver(delta: pa.Table, state: pa.Table, local: LocalAggregates, keys: Sequence[str], *,
                    schemas: Mapping[str, pa.Schema], batch_id: int, closes: dt.datetime | None,
                    retracting: bool, run_id: str, now: dt.datetime, batch_days: Set[dt.date] = frozenset(),
                    batch_rows: pa.Table | None = None) -> BatchOutputs:
    """Merge the batch's pre-aggregated ``delta`` (state columns plus ``_first_seen``) into ``state``.

    ``batch_days``/``batch_rows``: the touched days with a batch combine and their batch partial
    rows; for those days the batch rows count in ``aggregates`` instead of the state's.
    """
    keys = list(keys)
    state_keys = [DAY, *keys]
    columns = state.column_names
    touched = delta.select(keys).group_by(keys, use_threads=False).aggregate([]) if keys else delta.select([])
    new = pa.array(_new_alone(delta, state, keys, batch_days, batch_rows) if not retracting
                   else np.zeros(delta.num_rows, dtype=bool))
    quick, rest = delta.filter(new), delta.filter(pc.invert(new))
    key_rows = state.filter(pa.array(key_mask(state, keys, touched))).to_pylist()
    old = {tuple(r[k] for k in state_keys): r for r in key_rows}

    merged: list[dict[str, Any]] = []
    first_seen: dict[tuple[Any, ...], Any] = {}
    for row in rest.to_pylist():
        skey = tuple(row[k] for k in state_keys)
        key = skey[1:]
        seen = first_seen.get(key)
        first_seen[key] = row["_first_seen"] if seen is None else min(seen, row["_first_seen"])
        prev = old.get(skey)
        if prev is None:
            merged.append({c: row[c] for c in columns})
            continue
        accs = local.merge_rows([prev, row])
        version = local.version([prev, row])
        times = [t for t in (prev["max_event_time"], row["max_event_time"]) if t is not None]
        merged.append({**dict(zip(state_keys, skey, strict=True)), "n_rows": prev["n_rows"] + row["n_rows"],
                       **local.encode(accs, version), "max_event_time": max(times) if times else None,
                       SPEC_VERSION: version})

    written = {tuple(r[k] for k in state_keys) for r in merged}
    before: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    after: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in key_rows:
        skey = tuple(row[k] for k in state_keys)
        before[skey[1:]].append(row)
        if skey not in written:
            after[skey[1:]].append(row)
    for row in merged:
        after[tuple(row[k] for k in keys)].append(row)

    counted: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    if batch_rows is not None and batch_rows.num_rows:
        for row in batch_rows.filter(pa.array(key_mask(batch_rows, keys, touched))).to_pylist():
            counted[tuple(row[k] for k in keys)].append(row)

    changes: list[dict[str, Any]] = []
    rows_out: list[dict[str, Any]] = []
    for key in sorted(after, key=lambda k: (first_seen[k], k)):
        new_accs = local.merge_rows(after[key])
        new_n = sum(r["n_rows"] for r in after[key])
        new_version = local.version(after[key])
        new = local.values(new_accs, new_version)
        was = bool(before.get(key)) and sum(r["n_rows"] for r in before[key]) != 0
        prev_values = local.values(local.merge_rows(before[key]), local.version(before[key])) if was else None
        key_cols = dict(zip(keys, key, strict=True))
        gone = new_n == 0
        if not was and not gone:
            changes.append({"op": "+I", **key_cols, **new})
        elif was and gone:
            changes.append({"op": "-D", **key_cols, **(prev_values or {})})
        elif was and prev_values is not None and not same_values(prev_values, new):
            changes.extend([{"op": "-U", **key_cols, **prev_values}, {"op": "+U", **key_cols, **new}])
        inputs = [r for r in after[key] if r[DAY] not in batch_days] + counted[key]
        if inputs:  # the key's aggregates row, from the partials that count (its state, unless the hybrid rule)
            same = len(inputs) == len(after[key]) and not counted[key]
            accs = new_accs if same else local.merge_rows(inputs)
            version = new_version if same else local.version(inputs)
            n = sum(r["n_rows"] for r in inputs)
            if not (retracting and n == 0):
                rows_out.append({**key_cols, **local.values(accs, version), "n_rows": n, **local.encode(accs, version),
                                 "updated_at": now, "run_id": run_id, SPEC_VERSION: version})
    for seq, change in enumerate(changes):
        change.update(batch_id=batch_id, seq=seq)
    aggregates = pa.Table.from_pylist(rows_out, schema=schemas["aggregates"])
    changelog = pa.Table.from_pylist(changes, schema=schemas["changelog"])
    merged_table = pa.Table.from_pylist(merged, schema=state.schema)
    if quick.num_rows:
        versioned = _versioned(quick)
        values = value_columns(versioned, {}, local.compiled.entries, local.compiled.coverage)  # read once, for both
        changelog = _with_new_keys(changelog, [first_seen[tuple(c[k] for k in keys)] for c in changes], versioned,
                                   values, keys, schemas["changelog"], batch_id=batch_id)
        aggregates = pa.concat_tables([aggregates, _new_aggregates(versioned, values, local, keys,
                                                                   schemas["aggregates"], run_id=run_id, now=now)])
        merged_table = pa.concat_tables([merged_table, quick.select(columns).cast(state.schema)])
    kept = state.filter(pa.array(~key_mask(state, state_keys, merged_table)))
    new_state = pa.concat_tables([kept, merged_table])
    if closes is not None:
        new_state = new_state.filter(pc.greater(new_state.column("window_end"), pa.scalar(closes, pa.timestamp("us", "UTC"))))
    if retracting:
        new_state = new_state.filter(pc.not_equal(new_state.column("n_rows"), 0))
    return BatchOutputs(
        aggregates=aggregates,
        touched=touched.cast(pa.schema([schemas["aggregates"].field(k) for k in keys])),
        changelog=changelog,
        partials=partial_rows(delta, schemas["partials"], batch=f"stream-{batch_id}", run_id=run_id, now=now),
        state=new_state,
    )


def _new_alone(delta: pa.Table, state: pa.Table, keys: list[str], batch_days: Set[dt.date],
               batch_rows: pa.Table | None) -> np.ndarray:
    """The batch rows of keys the state does not hold, one row per key, of a day without a batch combine: their
    state row, ``aggregates`` row and ``+I`` are the row itself. At a realistic spread most of a batch's keys are
    new windows, and these take the column-wise path (no accumulator decoded, merged or encoded in Python)."""
    if delta.num_rows == 0 or not keys:
        return np.zeros(delta.num_rows, dtype=bool)
    alone = delta.select(keys).group_by(keys, use_threads=False).aggregate([([], "count_all")])
    alone = alone.filter(pc.equal(alone.column("count_all"), 1))
    out = key_mask(delta, keys, alone) & ~key_mask(delta, keys, state)
    if batch_days:
        out &= ~np.asarray(pc.is_in(delta.column(DAY), pa.array(sorted(batch_days), pa.date32())).to_numpy(
            zero_copy_only=False), dtype=bool)
    if batch_rows is not None and batch_rows.num_rows:
        out &= ~key_mask(delta, keys, batch_rows)
    return out


def _versioned(rows: pa.Table) -> pa.Table:
    """``rows`` with the spec version a row without one is counted as."""
    if SPEC_VERSION not in rows.column_names:
        return rows.append_column(SPEC_VERSION, pa.repeat(pa.scalar(ADOPTED, pa.int64()), rows.num_rows))
    at = rows.schema.get_field_index(SPEC_VERSION)
    return rows.set_column(at, SPEC_VERSION, pc.fill_null(rows.column(SPEC_VERSION), ADOPTED))


def _new_aggregates(rows: pa.Table, values: Mapping[str, pa.Array], local: LocalAggregates, keys: list[str],
                    schema: pa.Schema, *, run_id: str, now: dt.datetime) -> pa.Table:
    """The ``aggregates`` rows of new keys alone in the batch, column-wise: their values and accumulators
    (NULL for aggregates newer than a row's spec version, as ``LocalAggregates`` gives them)."""
    entries, coverage = local.compiled.entries, local.compiled.coverage
    out = {**{k: rows.column(k) for k in keys}, **values,
           "n_rows": rows.column("n_rows"), **encoded_columns(rows, {}, entries, schema, coverage),
           "updated_at": pa.repeat(pa.scalar(now, TS), rows.num_rows),
           "run_id": pa.repeat(pa.scalar(run_id), rows.num_rows), SPEC_VERSION: rows.column(SPEC_VERSION)}
    return pa.table([out[f.name].cast(f.type) for f in schema], schema=schema)


def _with_new_keys(changelog: pa.Table, first_seen: list[Any], rows: pa.Table, values: Mapping[str, pa.Array],
                   keys: list[str], schema: pa.Schema, *, batch_id: int) -> pa.Table:
    """The batch's changelog (each row's key first seen at ``first_seen``) with a ``+I`` per new key alone, every
    row numbered again in the order the engines share: keys by first event in the batch, then by key (``-U``
    before ``+U``)."""
    inserts = {"op": pa.repeat(pa.scalar("+I"), rows.num_rows), **{k: rows.column(k) for k in keys}, **values,
               "batch_id": pa.repeat(pa.scalar(batch_id, pa.int64()), rows.num_rows),
               "seq": pa.array(np.arange(changelog.num_rows, changelog.num_rows + rows.num_rows, dtype=np.int64))}
    both = pa.concat_tables([changelog, pa.table([inserts[f.name].cast(f.type) for f in schema], schema=schema)])
    seen = pa.concat_arrays([pa.array(first_seen, TS), rows.column("_first_seen").cast(TS).combine_chunks()])
    both = both.append_column("_first_seen", seen).sort_by(  # nulls first, as Spark orders them
        [(c, "ascending", "at_start") for c in ("_first_seen", *keys, "seq")])
    return both.drop_columns(["_first_seen", "seq"]).append_column(
        "seq", pa.array(np.arange(both.num_rows, dtype=np.int64))).select(schema.names)


def partial_rows(delta: pa.Table, schema: pa.Schema, *, batch: str, run_id: str, now: dt.datetime) -> pa.Table:
    """The batch's pre-aggregated rows as ``partials`` rows (source ``stream``), like ``batch_columns``."""
    n = delta.num_rows
    constants = {"batch": batch, "source": STREAM, "run_id": run_id, "created_at": now}
    arrays = [pa.array([constants[f.name]] * n, f.type) if f.name in constants else delta.column(f.name).cast(f.type)
              for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def same_values(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Spark's null-safe equality, NaN equal to NaN."""
    for name, x in a.items():
        y = b[name]
        if not (x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))):
            return False
    return True



class DriverEngine:
    """Merges on the driver; keeps the state it committed in memory while the table has not moved on."""

    name = "driver"

    def __init__(self, compiled: CompiledAggregates, lake: Lake, max_keys: int = DRIVER_MAX_KEYS) -> None:
        self.local = LocalAggregates(compiled)
        self.lake, self.max_keys = lake, max_keys
        spec = compiled.spec
        self.tables = PipelineTables(spec.lake, spec.name)
        self.keys = list(spec.key_columns)
        self._held: tuple[int | None, pa.Table] | None = None  # (state version, its rows)
        self._schemas: dict[str, pa.Schema] | None = None

    def accepts(self, keys: int) -> bool:
        """Whether a batch of ``keys`` pre-aggregated rows merges here: not too many keys, a state
        small enough to hold, and output tables that exist or that it may create (not those of sessions,
        whose first batch creates them in Spark)."""
        self._schemas = self._output_schemas() if keys <= self.max_keys else None
        return self._schemas is not None

    def _output_schemas(self) -> dict[str, pa.Schema] | None:
        t = self.tables
        spec = self.local.compiled.spec
        new = spec.window is None or not spec.window.session  # a missing table is created with its layout's columns
        schemas = {name: self.lake.schema(path) or (table_schema(spec, name) if new else None) for name, path in (
            ("aggregates", t.aggregates), ("changelog", t.changelog), ("partials", t.partials),
            ("state", t.stream_state))}
        if any(s is None for s in schemas.values()):
            return None
        if sum(f.num_records or 0 for f in self.lake.files(t.stream_state)) > DRIVER_MAX_STATE:
            return None
        return {k: s for k, s in schemas.items() if s is not None}

    def merge(self, batch: MiniBatch) -> BatchOutputs:
        schemas = self._schemas
        assert schemas is not None, "merge follows accepts"
        state_schema = schemas["state"]
        delta = self._delta(batch, state_schema)
        batch_rows = None
        if batch.batch_files:
            columns = [*self.keys, "n_rows", *self.local.compiled.acc_columns, SPEC_VERSION]
            partials = schemas["partials"]
            batch_rows = (self.lake.read_files(self.tables.partials, list(batch.batch_files)).select(*columns)
                          .toArrow().cast(pa.schema([partials.field(c) for c in columns])))
        return merge_on_driver(delta, self._state(state_schema), self.local, self.keys, schemas=schemas,
                               batch_id=batch.batch_id, closes=batch.closes, retracting=self.local.compiled.retracting,
                               run_id=batch.run_id, now=dt.datetime.now(dt.UTC), batch_days=batch.batch_days,
                               batch_rows=batch_rows)

    @staticmethod
    def _delta(batch: MiniBatch, state_schema: pa.Schema) -> pa.Table:
        first_seen = pa.field("_first_seen", state_schema.field("max_event_time").type)
        rows = batch.rows if batch.rows is not None else batch.delta.toArrow()
        return rows.select([*state_schema.names, "_first_seen"]).cast(
            pa.schema([*state_schema, first_seen]))

    def committed(self, state_version: int | None, outputs: BatchOutputs) -> None:
        assert isinstance(outputs.state, pa.Table)
        self._held = (state_version, outputs.state)

    def _state(self, schema: pa.Schema) -> pa.Table:
        version = self.lake.version(self.tables.stream_state)
        if version is None:
            return schema.empty_table()
        if self._held is None or self._held[0] != version:
            self._held = (version, self.lake.read(self.tables.stream_state).toArrow().select(schema.names).cast(schema))
        return self._held[1]
