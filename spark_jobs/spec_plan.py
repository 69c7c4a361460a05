"""A spec change on a live lake: what changed, what each change costs, and what ``apply`` does for it.

:func:`compare` sorts the differences between the lake's recorded spec and a new one into four kinds, as sqlmesh's
``plan`` sorts changes: ``settings`` (nothing to rewrite), ``stored`` (re-derived from the stored accumulators, no
raw data read), ``raw`` (needs the landing files; a change of the rows' layout drops the old partials) and
``refused`` (with the reason and the way out); docs/evolution.md lists which change is which. A window change is
its kind's to judge (``WindowKind.change_to``). :func:`make_plan` adds what the lake holds (rows per table, the
days to recombine and their landing rows, the commands that recombine them). Nothing here starts Spark or writes.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from spark_jobs.lake import PipelineTables, storage
from spark_jobs.lake.coverage import day_versions, uncovered_days
from spark_jobs.lake.layout import table_schema
from spark_jobs.lake.reader import is_table, open_table
from spark_jobs.lake.spec_record import RecordedSpec, fingerprint, has_data, normalise
from spark_jobs.lake.table_rules import partition_day
from spark_jobs.spec import AggregateSpec, PipelineSpec
from spark_jobs.windows.kind import RECOMBINE

__all__ = ["Change", "Diff", "Plan", "compare", "make_plan"]

Kind = Literal["settings", "stored", "raw", "refused"]
HEADINGS = {"settings": "settings only (nothing to rewrite)", "stored": "from the stored accumulators (no raw data)",
            "raw": "needs raw data (days to recombine)", "refused": "refused"}
_READ = ("format", "event_time", "op_column")  # the source fields that change how every row is read


@dataclass(frozen=True)
class Change:
    kind: Kind
    field: str
    what: str
    effect: str


@dataclass(frozen=True)
class Diff:
    """The differences between two specs of one pipeline, and the work they add up to."""

    changes: tuple[Change, ...]
    added: tuple[str, ...] = ()  # aggregates whose columns are added (new, or changed: NULL until recombined)
    dropped: tuple[str, ...] = ()  # aggregates whose columns are removed (dropped, or changed)
    dropped_keys: tuple[str, ...] = ()
    coarsened: bool = False  # stored windows merged into a coarser grid of tiles
    window_removed: bool = False
    reset: bool = False  # the rows' layout changed: every day's partials are dropped and recombined
    recount: bool = False  # the rows counted may differ (source columns): every day is recombined
    rollups_removed: tuple[str, ...] = ()
    reserved: bool = False  # the served windows change and are re-derived from the stored rows
    null_keys_grouped: bool = False  # rows rejected for a NULL group key count from now on

    @property
    def refused(self) -> list[Change]:
        return [c for c in self.changes if c.kind == "refused"]

    @property
    def derives(self) -> bool:
        """Whether rows are re-derived from the stored accumulators (a rewrite of the tables)."""
        return bool(self.dropped or self.dropped_keys or self.reserved) and not self.reset

    @property
    def needs_raw(self) -> bool:
        return bool(self.added) or self.reset or self.recount


def _describe(agg: AggregateSpec) -> str:
    args = f", {json.dumps(dict(agg.args))}" if agg.args else ""
    return f"{agg.name} = {agg.fn}({', '.join(agg.columns)}{args})"


def compare(old: PipelineSpec, new: PipelineSpec) -> Diff:
    """Every difference between the lake's spec ``old`` and ``new``, classified."""
    changes: list[Change] = []
    if old.name != new.name:
        changes.append(Change("refused", "name", f"name {old.name} -> {new.name}", f"a pipeline's name names its "
                              f"tables; keep {old.name!r}, or start a new pipeline in another lake"))
    reset, recount = _source_changes(old, new, changes)
    grouped = _null_key_change(old, new, changes)
    keys = _key_changes(old, new, changes)
    if (window := old.window.change_to(new.window) if old.window != new.window else None) is not None:
        changes.append(Change(window.cost, "window", window.what, window.effect))
    added, dropped = _aggregate_changes(old, new, changes)
    changes += [Change("settings", f"stream.{key}", f"stream.{key} {a} -> {b}", "the stream uses it from its next "
                       "start") for key in ("max_files_per_batch", "trigger", "watermark")
                if (a := getattr(old.stream, key)) != (b := getattr(new.stream, key))]
    removed = _rollup_changes(old, new, changes)
    reset = reset or keys == "raw" or (window is not None and window.cost == "raw")
    if reset:  # the layout changes: nothing is derived, every stored row goes
        dropped = [a.name for a in old.aggregates if a.name not in {n.name for n in new.aggregates} or a.name in added]
        added = [a.name for a in new.aggregates]
    stored = window is not None and window.cost == "stored" and not reset
    return Diff(tuple(changes), tuple(added), tuple(dropped),
                () if reset else tuple(k for k in old.group_by if k not in new.group_by),
                stored and window is not None and window.retile, stored and window is not None and window.unwindow,
                reset, recount or grouped is False, removed, reserved=stored, null_keys_grouped=bool(grouped))


def _source_changes(old: PipelineSpec, new: PipelineSpec, changes: list[Change]) -> tuple[bool, bool]:
    """How rows are read and typed: (the layout resets, every day is recounted)."""
    o_src, n_src = normalise(old)["source"], normalise(new)["source"]
    o_cols, n_cols = old.source.columns, new.source.columns
    resets = [Change("raw", f"source.{key}", f"source.{key} {o_src.get(key)} -> {n_src.get(key)}",
                     f"the rows are read differently: {RECOMBINE}")
              for key in _READ if o_src.get(key) != n_src.get(key)]
    resets += [Change("raw", f"source.schema.{col}", f"column {col}: {o_cols[col]} -> {n_cols[col]}",
                      f"values are typed differently: {RECOMBINE}")
               for col in sorted(set(o_cols) & set(n_cols)) if o_cols[col] != n_cols[col]]
    changes += resets + [Change("raw", f"source.schema.{col}", f"column {col} ({n_cols[col]}) added", "rows whose "
                                "value cannot be read as that type are rejected from now on; recombine to count "
                                "every day so") for col in sorted(set(n_cols) - set(o_cols))]
    changes += [Change("raw", f"source.schema.{col}", f"column {col} removed", "rows rejected only for that column "
                       "count from now on; recombine to count every day so")
                for col in sorted(set(o_cols) - set(n_cols))]
    changes += [Change("settings", f"source.{key}", f"source.{key} {o_src.get(key)} -> {n_src.get(key)}",
                       "applies to the next runs") for key in sorted(set(o_src) | set(n_src))
                if key not in (*_READ, "schema", "null_keys") and o_src.get(key) != n_src.get(key)]
    return bool(resets), set(n_cols) != set(o_cols)


def _null_key_change(old: PipelineSpec, new: PipelineSpec, changes: list[Change]) -> bool | None:
    """``source.null_keys``: True when NULL keys group from now on, False when they are rejected, None: unchanged."""
    before, after = old.source.null_keys, new.source.null_keys
    if before == after:
        return None
    effect = ("rows rejected for a NULL group key form groups from now on: the days whose dead letters hold them "
              "are recombined" if after == "group" else
              "rows with a NULL group key are rejected from now on: every day is recombined")
    changes.append(Change("raw", "source.null_keys", f"source.null_keys {before} -> {after}", effect))
    return after == "group"


def _key_changes(old: PipelineSpec, new: PipelineSpec, changes: list[Change]) -> Kind | None:
    """The group keys' change, and its cost."""
    added = [k for k in new.group_by if k not in old.group_by]
    dropped = [k for k in old.group_by if k not in new.group_by]
    if added:
        change = Change("raw", "group_by", f"keys added: {', '.join(added)}",
                        f"the stored rows hold no value for them: {RECOMBINE}")
    elif dropped and new.window.cut_per_key:
        change = Change("raw", "group_by", f"keys dropped: {', '.join(dropped)}",
                        f"{new.window} are cut per key: {RECOMBINE}")
    elif dropped:
        change = Change("stored", "group_by", f"keys dropped: {', '.join(dropped)}",
                        "partials, aggregates, rollups and the stream's state are merged across them")
    elif list(old.group_by) != list(new.group_by):
        change = Change("settings", "group_by", f"key order {list(old.group_by)} -> {list(new.group_by)}",
                        "tables are read by column name: nothing to rewrite")
    else:
        return None
    changes.append(change)
    return change.kind


def _aggregate_changes(old: PipelineSpec, new: PipelineSpec, changes: list[Change]) -> tuple[list[str], list[str]]:
    """The aggregates added (or changed) and dropped (or changed)."""
    o_aggs, n_aggs = {a.name: a for a in old.aggregates}, {a.name: a for a in new.aggregates}
    added, dropped = [], []
    for name, agg in n_aggs.items():
        if (before := o_aggs.get(name)) is None:
            added.append(name)
            changes.append(Change("raw", f"aggregates[{name}]", f"aggregate added: {_describe(agg)}", "columns added "
                                  "(no file rewritten); NULL in the windows of days not recombined since"))
        elif (before.fn, before.columns, before.args) != (agg.fn, agg.columns, agg.args):
            added.append(name)
            dropped.append(name)
            changes.append(Change("raw", f"aggregates[{name}]",
                                  f"aggregate changed: {_describe(before)} -> {_describe(agg)}",
                                  "its old columns are removed and new ones added; NULL until the days are recombined"))
    for name, agg in o_aggs.items():
        if name not in n_aggs:
            dropped.append(name)
            changes.append(Change("stored", f"aggregates[{name}]", f"aggregate dropped: {_describe(agg)}",
                                  "its columns are removed from partials, aggregates, rollups and the stream's state "
                                  "(the changelog keeps them, NULL from now on)"))
    if not added and not dropped and list(o_aggs) != list(n_aggs):
        changes.append(Change("settings", "aggregates", "aggregate order changed", "tables are read by column name"))
    return added, dropped


def _rollup_changes(old: PipelineSpec, new: PipelineSpec, changes: list[Change]) -> tuple[str, ...]:
    """The rollups' changes; the names of the rollups removed."""
    o_r, n_r = {r.name: r for r in old.rollups}, {r.name: r for r in new.rollups}
    for name, r in n_r.items():
        if name not in o_r:
            changes.append(Change("settings", f"rollups[{name}]", f"rollup added: {name} ({r.grain} by "
                                  f"{', '.join(r.by) or '-'})", f"rollup_{name} is built from aggregates"))
        elif (o_r[name].grain, o_r[name].by) != (r.grain, r.by):
            changes.append(Change("stored", f"rollups[{name}]", f"rollup {name}: {o_r[name].grain} by "
                                  f"{list(o_r[name].by)} -> {r.grain} by {list(r.by)}",
                                  f"rollup_{name} is rebuilt from aggregates"))
    removed = tuple(name for name in o_r if name not in n_r)
    changes += [Change("stored", f"rollups[{name}]", f"rollup removed: {name}", f"the table rollup_{name} is deleted")
                for name in removed]
    return removed


@dataclass(frozen=True)
class DayCost:
    """A day to recombine: its landing rows and files (``None`` when the landing partition is gone)."""

    date: str
    landing_rows: int | None
    landing_files: int


@dataclass
class Plan:
    """What ``apply`` would do to a lake, and what is left to recombine from raw data afterwards."""

    pipeline: str
    spec_origin: str
    lake: str
    current: RecordedSpec | None
    diff: Diff
    version: int  # the spec version apply records
    table_rows: dict[str, int] = field(default_factory=dict)  # rows of each existing table apply rewrites
    days: list[DayCost] = field(default_factory=list)
    new_tables: dict[str, list[str]] = field(default_factory=dict)  # a new lake: table -> its columns
    pending: bool = False  # an apply of this very spec was cut off: apply finishes it

    @property
    def unchanged(self) -> bool:
        return self.current is not None and not self.diff.changes and not self.pending

    def commands(self) -> list[str]:
        """The commands that recombine the days: an Airflow backfill of the batch DAG, or the CLI."""
        return [c for first, last in day_ranges([d.date for d in self.days]) for c in (
            f"airflow backfill create --dag-id {self.pipeline}_batch --from-date {first} --to-date {last}",
            f"python -m spark_jobs run --pipeline {self.spec_origin} --from {first} --to {last}")]

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "lake": self.lake, "spec": self.spec_origin,
                "recorded_version": None if self.current is None else self.current.version,
                "version": self.version, "unchanged": self.unchanged, "pending_apply": self.pending,
                "changes": [asdict(c) for c in self.diff.changes], "refused": bool(self.diff.refused),
                "rewrites": self.table_rows, "recombine": [asdict(d) for d in self.days], "commands": self.commands(),
                "new_tables": self.new_tables}

    def text(self) -> str:
        if self.current is None and self.new_tables:
            return "\n".join([f"{self.pipeline}: no lake at {self.lake}/{self.pipeline} yet; the first job creates "
                              "these tables and records this spec as version 1:",
                              *(f"  {t}: {', '.join(cols)}" for t, cols in self.new_tables.items())])
        if self.unchanged and self.current is not None:
            return (f"{self.pipeline}: the lake is at spec version {self.current.version}, the same as "
                    f"{self.spec_origin}; nothing to apply" + self._left())
        lines = [f"{self.pipeline}: spec version {self.current.version if self.current else '-'} -> {self.version}"
                 + (" (adopting a lake written before spec records)" if self.current is None else "")
                 + (" (finishing an apply that was cut off)" if self.pending else "")]
        for kind, heading in HEADINGS.items():
            if entries := [c for c in self.diff.changes if c.kind == kind]:
                lines += [f"  {heading}:", *(f"    - {c.what}: {c.effect}" for c in entries)]
        if self.table_rows:
            lines.append("  rewritten from the stored accumulators: " + ", ".join(
                f"{t} ({n:,} rows)" for t, n in self.table_rows.items()))
        if self.diff.refused:
            lines.append("  apply refuses this spec; nothing was changed")
        return "\n".join(lines) + self._left()

    def _left(self) -> str:
        if not self.days:
            return ""
        rows = sum(d.landing_rows or 0 for d in self.days)
        missing = [d.date for d in self.days if d.landing_rows is None]
        span = self.days[0].date if len(self.days) == 1 else f"{self.days[0].date}..{self.days[-1].date}"
        lines = [f"\n  days to recombine from raw data after apply: {len(self.days)} ({span}), {rows:,} landing rows"]
        if missing:
            more = " ..." if len(missing) > 10 else ""
            lines.append(f"  no landing files any more for {', '.join(missing[:10])}{more}: those days stay NULL for "
                         "the new aggregates (or unserved after a layout change) until their files are landed again")
        lines += ["  recombine them with:", *(f"    {c}" for c in self.commands())]
        return "\n".join(lines)


def day_ranges(days: Sequence[str]) -> list[tuple[str, str]]:
    """Consecutive dates as (first, last) ranges."""
    out: list[tuple[str, str]] = []
    for d in sorted(days):
        if out and dt.date.fromisoformat(d) - dt.date.fromisoformat(out[-1][1]) == dt.timedelta(days=1):
            out[-1] = (out[-1][0], d)
        else:
            out.append((d, d))
    return out


def landing_rows(spec: PipelineSpec, date: str) -> tuple[int | None, int]:
    """Rows and files in a landing partition, from Parquet footers or line counts (no Spark)."""
    folder = spec.source.partition_path(date)
    if not storage.is_dir(folder):
        return None, 0
    files = storage.list_dir(folder)
    rows = 0
    for f in files:
        with suppress(OSError, ValueError):  # unreadable (ArrowInvalid is a ValueError): no rows; combine reports it
            if spec.source.format == "parquet":
                with storage.open_input(f) as handle:
                    rows += pq.read_metadata(handle).num_rows
            else:
                lines = sum(1 for line in storage.read_bytes(f).splitlines() if line.strip())
                rows += max(lines - 1, 0) if spec.source.format == "csv" else lines
    return rows, len(files)


def _table_rows(path: str) -> int:
    actions = open_table(path).add_actions()
    return int(sum(n or 0 for n in actions.column("num_records").to_pylist())) if actions.num_rows else 0


def make_plan(spec: PipelineSpec, records: Sequence[RecordedSpec]) -> Plan:
    """The plan of making the lake match ``spec``: the changes, their costs, the days left to recombine.
    ``records`` are the lake's spec record, oldest first (empty for a new lake, or one written before spec
    records, which apply adopts)."""
    tables = PipelineTables(spec.lake, spec.name)
    current = records[-1] if records else None
    if current is None and not has_data(spec.lake, spec.name):
        new = {t: table_schema(spec, t).names for t in ("partials", "aggregates", "changelog")}
        return Plan(spec.name, spec.origin, spec.lake, None, Diff(()), 1,
                    new_tables=new | {r.table: table_schema(spec, r.table, r).names for r in spec.rollups})
    if current is None:  # adopting a lake from before spec records
        diff = Diff((Change("settings", "spec", "record this spec as the lake's (version 1)",
                            "its tables must have this spec's columns, and gain a spec_version column"),))
        return Plan(spec.name, spec.origin, spec.lake, None, diff, 1)
    pending = not current.applied
    if pending and current.fingerprint != fingerprint(normalise(spec)):
        diff = Diff((Change("refused", "spec", f"an apply to spec version {current.version} has not finished",
                            "run apply with the spec of that version first (it is in the lake's specs table: "
                            f"`python -m spark_jobs inspect show {spec.name}.specs`), then this change"),))
        return Plan(spec.name, spec.origin, spec.lake, current, diff, current.version)
    base = (next((r for r in reversed(records) if r.applied and r.version < current.version), None) if pending
            else current)
    old = base.pipeline_spec(lake=spec.lake, source_path=spec.source.path) if base is not None else spec
    diff = compare(old, spec)
    plan = Plan(spec.name, spec.origin, spec.lake, current, diff,
                current.version if pending or not diff.changes else current.version + 1, pending=pending)
    rewritten = {"partials": tables.partials, "aggregates": tables.aggregates, "stream state": tables.stream_state}
    plan.table_rows = {name: _table_rows(path) for name, path in rewritten.items() if diff.derives and is_table(path)}
    days = set(pending_days(spec, current))
    if diff.needs_raw:
        days |= set(day_versions(tables.partials))
    # rows rejected only for lacking a key count under the new spec: a dropped key, or any key once NULL keys group
    if keys := (old.group_by if diff.null_keys_grouped else diff.dropped_keys):
        days |= rejected_only_for(tables.dead_letter, [f"group key {k} is missing" for k in keys])
    plan.days = [DayCost(d, *landing_rows(spec, d)) for d in sorted(days)]
    return plan


def pending_days(spec: PipelineSpec, record: RecordedSpec) -> list[str]:
    """The days earlier changes left to recombine: whose partials predate an aggregate, and, after a change
    of the rows' layout, the landing days up to the last day it dropped that no batch combine redid since."""
    versions = day_versions(PipelineTables(spec.lake, spec.name).partials)
    days = {d for ds in uncovered_days(record.coverage, versions).values() for d in ds}
    if record.uncovered_through is not None:
        days |= {d for d in landing_days(spec) if dt.date.fromisoformat(d) <= record.uncovered_through
                 and versions.get(d, 0) < record.layout_since}
    return sorted(days)


def landing_days(spec: PipelineSpec) -> list[str]:
    """The event days with a landing partition."""
    names = [p.rsplit("/", 1)[-1] for p in storage.list_dir(spec.source.path, dirs=True)]
    return sorted(d for n in names if (d := partition_day(n)))


def rejected_only_for(dead_letter: str, reasons: Sequence[str]) -> set[str]:
    """Event days with rows in ``dead_letter`` rejected for nothing but ``reasons`` (each a whole reason)."""
    allowed = pa.array(sorted(set(reasons)), pa.string())
    if not is_table(dead_letter) or not len(allowed):
        return set()
    only = pc.match_substring(pc.field("reason"), allowed[0].as_py())
    for reason in allowed[1:]:  # read only the rows that name one of them (a row's reasons are joined by "; ")
        only = only | pc.match_substring(pc.field("reason"), reason.as_py())
    rows = open_table(dead_letter).read(["reason", "source_file", "batch", "job"], filter=only)
    parts = pc.split_pattern(rows.column("reason").combine_chunks(), "; ")
    other = pc.list_parent_indices(parts).filter(pc.invert(pc.is_in(pc.list_flatten(parts), allowed)))
    rows = rows.filter(np.isin(np.arange(rows.num_rows), other.to_numpy(), invert=True))
    found = pc.extract_regex(rows.column("source_file"), r"event_date=(?P<day>\d{4}-\d{2}-\d{2})")
    batch = pc.if_else(pc.equal(rows.column("job"), "combine"), rows.column("batch"), pa.scalar(None, pa.string()))
    days = pc.coalesce(pc.struct_field(found, "day"), batch)
    return {d for d in pc.unique(days).to_pylist() if d}
