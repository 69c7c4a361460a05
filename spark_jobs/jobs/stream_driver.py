"""A small mini-batch's state merge on the driver: Arrow in, Arrow out, no Spark job.

The rules are those of the Spark path in :mod:`spark_jobs.jobs.stream` (and the tests hold
the two to the same tables): each touched (day, key) state row is merged once with the
batch's pre-aggregated row; a key's value merges its rows of all days; the changelog
compares each touched key's value before and after; closed windows leave state.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.lake.arrow import key_mask
from spark_jobs.plan.local import LocalAggregates

__all__ = ["DriverMerge", "merge_on_driver", "partial_rows"]

DAY = "event_date"


@dataclass(frozen=True)
class DriverMerge:
    """A batch's outputs, cast to their tables' schemas."""

    aggregates: pa.Table  # touched keys that still exist, as ``aggregates`` rows
    touched: pa.Table  # the touched keys (their other rows in ``aggregates`` are replaced)
    changelog: pa.Table
    state: pa.Table  # the whole new state
    state_writes: int


def merge_on_driver(delta: pa.Table, state: pa.Table, local: LocalAggregates, keys: Sequence[str], *,
                    schemas: Mapping[str, pa.Schema], batch_id: int, closes: dt.datetime | None,
                    retracting: bool, run_id: str, now: dt.datetime) -> DriverMerge:
    """Merge the batch's pre-aggregated ``delta`` (state columns plus ``_first_seen``) into ``state``."""
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
        accs = local.merge(local.decode(prev), local.decode(row))
        times = [t for t in (prev["max_event_time"], row["max_event_time"]) if t is not None]
        merged.append({**dict(zip(state_keys, skey, strict=True)), "n_rows": prev["n_rows"] + row["n_rows"],
                       **local.encode(accs), "max_event_time": max(times) if times else None})

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

    changes: list[dict[str, Any]] = []
    rows_out: list[dict[str, Any]] = []
    for key in sorted(after, key=lambda k: (first_seen[k], k)):
        new_accs = local.merge_rows(after[key])
        new_n = sum(r["n_rows"] for r in after[key])
        new = local.values(new_accs)
        was = bool(before.get(key)) and sum(r["n_rows"] for r in before[key]) != 0
        prev_values = local.values(local.merge_rows(before[key])) if was else None
        key_cols = dict(zip(keys, key, strict=True))
        gone = new_n == 0
        if not was and not gone:
            changes.append({"op": "+I", **key_cols, **new})
        elif was and gone:
            changes.append({"op": "-D", **key_cols, **(prev_values or {})})
        elif was and prev_values is not None and not _same(prev_values, new):
            changes.extend([{"op": "-U", **key_cols, **prev_values}, {"op": "+U", **key_cols, **new}])
        if not (retracting and new_n == 0):
            rows_out.append({**key_cols, **new, "n_rows": new_n, **local.encode(new_accs), "updated_at": now,
                             "run_id": run_id})
    for seq, change in enumerate(changes):
        change.update(batch_id=batch_id, seq=seq)

    merged_table = pa.Table.from_pylist(merged, schema=state.schema)
    kept = state.filter(pa.array(~key_mask(state, state_keys, merged_table)))
    new_state = pa.concat_tables([kept, merged_table])
    if closes is not None:
        new_state = new_state.filter(pc.greater(new_state.column("window_end"), pa.scalar(closes, pa.timestamp("us", "UTC"))))
    if retracting:
        new_state = new_state.filter(pc.not_equal(new_state.column("n_rows"), 0))
    return DriverMerge(
        aggregates=pa.Table.from_pylist(rows_out, schema=schemas["aggregates"]),
        touched=touched.cast(pa.schema([schemas["aggregates"].field(k) for k in keys])),
        changelog=pa.Table.from_pylist(changes, schema=schemas["changelog"]),
        state=new_state,
        state_writes=len(merged),
    )


def partial_rows(delta: pa.Table, schema: pa.Schema, *, batch: str, run_id: str, now: dt.datetime) -> pa.Table:
    """The batch's pre-aggregated rows as ``partials`` rows (source ``stream``), like ``batch_columns``."""
    n = delta.num_rows
    constants = {"batch": batch, "source": "stream", "run_id": run_id, "created_at": now}
    arrays = [pa.array([constants[f.name]] * n, f.type) if f.name in constants else delta.column(f.name).cast(f.type)
              for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Spark's null-safe equality, NaN equal to NaN."""
    for name, x in a.items():
        y = b[name]
        if not (x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))):
            return False
    return True
