"""The stream's driver merge engine: a small mini-batch merged with the aggregates' Python
algebra, Arrow in, Arrow out, no Spark job.

Planning and scheduling a merge's Spark jobs costs seconds, merging a few thousand keys
milliseconds; the state of open windows stays in memory between batches. The rules are those
of :mod:`spark_jobs.jobs.stream_spark` (a test holds the two to byte-identical tables): each
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

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.jobs.stream_step import BatchOutputs, MiniBatch
from spark_jobs.lake import Lake, PipelineTables
from spark_jobs.lake.arrow import key_mask
from spark_jobs.lake.layout import SPEC_VERSION
from spark_jobs.lake.rules import DAY, STREAM
from spark_jobs.plan import CompiledAggregates
from spark_jobs.plan.local import LocalAggregates

__all__ = ["DRIVER_MAX_KEYS", "DriverEngine", "merge_on_driver", "partial_rows", "same_values"]

DRIVER_MAX_KEYS = 50_000  # (day, key, window) rows of a pre-aggregated batch merged on the driver
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
    key_rows = state.filter(pa.array(key_mask(state, keys, touched))).to_pylist()
    old = {tuple(r[k] for k in state_keys): r for r in key_rows}

    merged: list[dict[str, Any]] = []
    first_seen: dict[tuple[Any, ...], Any] = {}
    for row in delta.to_pylist():
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

    merged_table = pa.Table.from_pylist(merged, schema=state.schema)
    kept = state.filter(pa.array(~key_mask(state, state_keys, merged_table)))
    new_state = pa.concat_tables([kept, merged_table])
    if closes is not None:
        new_state = new_state.filter(pc.greater(new_state.column("window_end"), pa.scalar(closes, pa.timestamp("us", "UTC"))))
    if retracting:
        new_state = new_state.filter(pc.not_equal(new_state.column("n_rows"), 0))
    return BatchOutputs(
        aggregates=pa.Table.from_pylist(rows_out, schema=schemas["aggregates"]),
        touched=touched.cast(pa.schema([schemas["aggregates"].field(k) for k in keys])),
        changelog=pa.Table.from_pylist(changes, schema=schemas["changelog"]),
        partials=partial_rows(delta, schemas["partials"], batch=f"stream-{batch_id}", run_id=run_id, now=now),
        state=new_state,
    )


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
        small enough to hold, and output tables that exist (the first batch creates them in Spark)."""
        self._schemas = self._output_schemas() if keys <= self.max_keys else None
        return self._schemas is not None

    def _output_schemas(self) -> dict[str, pa.Schema] | None:
        t = self.tables
        schemas = {name: self.lake.schema(path) for name, path in (
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
        return batch.delta.toArrow().select([*state_schema.names, "_first_seen"]).cast(
            pa.schema([*state_schema, first_seen]))

    def committed(self, state_version: int | None, outputs: BatchOutputs) -> None:
        assert isinstance(outputs.state, pa.Table)
        self._held = (state_version, outputs.state)

    def _state(self, schema: pa.Schema) -> pa.Table:
        version = self.lake.version(self.tables.stream_state)
        if self._held is None or self._held[0] != version:
            self._held = (version, self.lake.read(self.tables.stream_state).toArrow().select(schema.names).cast(schema))
        return self._held[1]
