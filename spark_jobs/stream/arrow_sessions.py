"""The stream's driver merge engine for session windows: the rules of
:class:`spark_jobs.stream.spark_engine.SessionEngine` in the aggregates' Python algebra (a test holds the two
to the same tables).

A batch's partial sessions merge with the partial sessions that count (the hybrid rule) of the sessions they
reach, read from ``partials`` without the batch's own rows, so a late event that bridges two served sessions
merges them and a replay derives the same changelog. The state keeps each key's open
sessions per event day.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.lake import Lake
from spark_jobs.lake.arrow import key_mask
from spark_jobs.lake.layout import SPEC_VERSION
from spark_jobs.lake.table_rules import DAY
from spark_jobs.phases import CompiledAggregates
from spark_jobs.phases.python_merge import LocalAggregates
from spark_jobs.stream.arrow_engine import DriverEngine, partial_rows, same_values
from spark_jobs.stream.outputs import BatchOutputs, MiniBatch
from spark_jobs.stream.spark_engine import sessions_in_reach

__all__ = ["DriverSessionEngine", "merge_sessions_on_driver"]

Row = dict[str, Any]


def cut_sessions(rows: Iterable[Mapping[str, Any]], by: Sequence[str]) -> dict[tuple[Any, ...], list[list[Mapping[str, Any]]]]:
    """Partial sessions per ``by`` key cut into sessions, as :func:`spark_jobs.phases.compiled.merge_sessions`:
    sorted by start, a partial joins the session before it when it starts at or before its latest end."""
    by_key: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_key[tuple(row[k] for k in by)].append(row)
    out: dict[tuple[Any, ...], list[list[Mapping[str, Any]]]] = {}
    for key, partials in by_key.items():
        partials.sort(key=lambda r: (r["window_start"], r["window_end"]))
        sessions: list[list[Mapping[str, Any]]] = []
        latest = None
        for row in partials:
            if latest is None or row["window_start"] > latest:
                sessions.append([row])
                latest = row["window_end"]
            else:
                sessions[-1].append(row)
                latest = max(latest, row["window_end"])
        out[key] = sessions
    return out


def _session(rows: list[Mapping[str, Any]], local: LocalAggregates) -> tuple[Row, list[Any] | None, int]:
    """A session's bounds and row count, its merged accumulators (None: one partial, kept as stored) and
    spec version."""
    bounds = {"window_start": min(r["window_start"] for r in rows), "window_end": max(r["window_end"] for r in rows),
              "n_rows": sum(r["n_rows"] for r in rows)}
    return bounds, (local.merge_rows(rows) if len(rows) > 1 else None), local.version(rows)


def _sort_key(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple((v is not None, v) for v in values)  # NULL first, as Spark's ascending order


def merge_sessions_on_driver(delta: pa.Table, stored: pa.Table, state: pa.Table, local: LocalAggregates,
                             group: Sequence[str], *, schemas: Mapping[str, pa.Schema], batch_id: int,
                             closes: dt.datetime | None, run_id: str, now: dt.datetime,
                             batch_days: frozenset[dt.date] = frozenset()) -> BatchOutputs:
    """Merge the batch's partial sessions ``delta`` (state columns plus ``_first_seen``, per event day).

    ``stored``: the partial sessions that count (without the batch's own rows) of the sessions the batch
    reaches. The sessions before the batch are those of ``stored``; after it, those of ``stored`` and the
    batch's rows of days without a batch combine, served as ``aggregates`` rows (``touched`` is left empty:
    the engine names the served sessions they replace).
    """
    group = list(group)
    delta_rows = delta.to_pylist()
    first_seen: dict[tuple[Any, ...], Any] = {}
    for row in delta_rows:
        key = tuple(row[k] for k in group)
        seen = first_seen.get(key)
        first_seen[key] = row["_first_seen"] if seen is None else min(seen, row["_first_seen"])
    stored_rows = stored.to_pylist()
    live = [r for r in delta_rows if r[DAY] not in batch_days]
    before = cut_sessions(stored_rows, group)
    after = cut_sessions([*stored_rows, *live], group)

    changes: list[Row] = []
    rows_out: list[Row] = []
    for key in sorted(after, key=lambda k: (first_seen[k], _sort_key(k))):
        key_cols = dict(zip(group, key, strict=True))
        old = {}
        for rows in before.get(key, []):
            bounds, accs, version = _session(rows, local)
            old[bounds["window_start"]] = {"window_end": bounds["window_end"],
                                           **local.values(accs or local.merge_rows(rows), version)}
        new = {}
        for rows in after[key]:
            bounds, accs, version = _session(rows, local)
            accs = accs or local.merge_rows(rows)
            values = local.values(accs, version)
            new[bounds["window_start"]] = {"window_end": bounds["window_end"], **values}
            rows_out.append({**key_cols, **bounds, **values, **local.encode(accs, version),
                             "updated_at": now, "run_id": run_id, SPEC_VERSION: version})
        for start in sorted(old.keys() | new.keys()):  # a session is named by its key and start
            named = {"op": None, **key_cols, "window_start": start}
            was, grown = old.get(start), new.get(start)
            if was is None and grown is not None:
                changes.append({**named, "op": "+I", **grown})
            elif was is not None and grown is None:
                changes.append({**named, "op": "-D", **was})
            elif was is not None and grown is not None and not same_values(was, grown):
                changes += [{**named, "op": "-U", **was}, {**named, "op": "+U", **grown}]
    for seq, change in enumerate(changes):
        change.update(batch_id=batch_id, seq=seq)

    touched = delta.select(group).group_by(group, use_threads=False).aggregate([]) if group else None
    in_touched = key_mask(state, group, touched) if touched is not None else np.ones(state.num_rows, dtype=bool)
    opened = cut_sessions([*state.filter(pa.array(in_touched)).to_pylist(), *delta_rows], [DAY, *group])
    state_rows: list[Row] = []
    for day_key, sessions in opened.items():
        for rows in sessions:
            bounds, accs, version = _session(rows, local)
            times = [r["max_event_time"] for r in rows if r["max_event_time"] is not None]
            state_rows.append({**dict(zip([DAY, *group], day_key, strict=True)), **bounds,
                               **(local.encode(accs, version) if accs is not None else
                                  {c: rows[0][c] for c in local.compiled.acc_columns}),
                               "max_event_time": max(times) if times else None, SPEC_VERSION: version})
    new_state = pa.concat_tables([state.filter(pa.array(~in_touched)),
                                  pa.Table.from_pylist(state_rows, schema=state.schema)])
    if closes is not None:  # an event at the watermark still joins a session ending there
        new_state = new_state.filter(pc.greater_equal(new_state.column("window_end"),
                                                      pa.scalar(closes, pa.timestamp("us", "UTC"))))
    aggregates = schemas["aggregates"]
    return BatchOutputs(
        aggregates=pa.Table.from_pylist(rows_out, schema=aggregates),
        touched=aggregates.empty_table().select(list(local.compiled.spec.key_columns)),  # the engine names them
        changelog=pa.Table.from_pylist(changes, schema=schemas["changelog"]),
        partials=partial_rows(delta, schemas["partials"], batch=f"stream-{batch_id}", run_id=run_id, now=now),
        state=new_state,
    )


class DriverSessionEngine(DriverEngine):
    """Merges session windows on the driver: the partial sessions in the batch's reach read in Spark
    (:func:`~spark_jobs.stream.spark_engine.sessions_in_reach`), merged in Python; the state of open sessions
    stays in memory between batches."""

    def __init__(self, compiled: CompiledAggregates, lake: Lake, max_keys: int) -> None:
        super().__init__(compiled, lake, max_keys)
        self._cached: list[Any] = []

    def merge(self, batch: MiniBatch) -> BatchOutputs:
        from pyspark.sql import functions as F

        schemas = self._schemas
        assert schemas is not None, "merge follows accepts"
        compiled = self.local.compiled
        spec = compiled.spec
        live = batch.delta.where(~F.col(DAY).isin(sorted(batch.batch_days))) if batch.batch_days else batch.delta
        reach = sessions_in_reach(self.lake, self.tables, spec, batch, live)
        self._cached += reach.cached
        columns = [*self.keys, "n_rows", *compiled.acc_columns, SPEC_VERSION]
        stored = reach.stored.select(*columns).toArrow().cast(pa.schema([schemas["partials"].field(c) for c in columns]))
        served = reach.served.toArrow().cast(pa.schema([schemas["aggregates"].field(c) for c in spec.key_columns]))
        out = merge_sessions_on_driver(self._delta(batch, schemas["state"]), stored, self._state(schemas["state"]),
                                       self.local, spec.group_by, schemas=schemas, batch_id=batch.batch_id,
                                       closes=batch.closes, run_id=batch.run_id, now=dt.datetime.now(dt.UTC),
                                       batch_days=batch.batch_days)
        return dataclasses.replace(out, touched=served, read_version=reach.read_version)

    def committed(self, state_version: int | None, outputs: BatchOutputs) -> None:
        super().committed(state_version, outputs)
        for df in self._cached:
            df.unpersist()
        self._cached = []
