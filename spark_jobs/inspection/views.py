"""Read-only views of the lake's Delta tables, as Arrow tables: what the CLI prints and the web page renders.

Everything reads through :mod:`spark_jobs.lake.reader` and :mod:`spark_jobs.lake.runs_table` (no Spark) and
never writes. A table is named ``<pipeline>.<table>`` (confined to the lake root) or, on the command line only,
by its path. Versions are checked against the table's history; filters go through ``parse_where``, never SQL. The
views, in this order: versions, tables, history, rows, keys/schema/partitions, diff, runs, chart data, coverage.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.errors import InspectError, LakeError
from spark_jobs.inspection.where import TIME_PATTERN, is_number, parse_where
from spark_jobs.key_match import arrow_join
from spark_jobs.lake import GUARD_PREFIX, PipelineTables
from spark_jobs.lake.reader import READ_ERRORS, CommitChange, Snapshot, commit_time, is_table, open_table
from spark_jobs.lake.runs_table import dead_letter_rows_by_run, read_runs
from spark_jobs.lake.tables import TABLES, is_table_name

if TYPE_CHECKING:
    from spark_jobs.lake.spec_record import RecordedSpec
    from spark_jobs.spec import PipelineSpec

__all__ = ["BOOKKEEPING", "LAKE_ENV", "column_list", "coverage", "spec_versions", "Series", "TableDiff", "TableRef", "default_lake", "is_delta",
           "diff", "history", "list_tables", "open_version", "parse_time", "partitions", "resolve_table", "runs",
           "schema", "series", "show", "sort_keys", "table_keys", "versions", "is_number"]

LAKE_ENV = "SPARK_JOBS_LAKE"
BOOKKEEPING = ("run_id", "created_at", "updated_at")
_PIPELINE = r"[a-z][a-z0-9_]*"
_QUALIFIED = re.compile(rf"^({_PIPELINE})\.([a-z][a-z0-9_]*)$")


@dataclass(frozen=True)
class TableRef:
    """A Delta table: ``name`` as the user wrote it, its local ``path``, and which pipeline table it is."""

    name: str
    path: str
    pipeline: str | None = None
    table: str | None = None  # partials, aggregates, ... when the path says so


def _arrow(rows: list[dict[str, Any]], /, *fields: tuple[str, pa.DataType], **types: pa.DataType) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=pa.schema([*fields, *types.items()]))


def _lake_dir(lake: str) -> None:
    if not Path(lake).is_dir():
        raise LakeError(f"lake root {lake} does not exist; run a pipeline first or pass the right --lake")


def default_lake() -> str | None:
    return os.environ.get(LAKE_ENV) or None


def _inside(path: str | Path, root: str | Path) -> bool:
    """``path`` resolves (symlinks followed) to ``root`` or below it."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip(os.sep) + os.sep)


def is_delta(path: str) -> bool:
    try:
        return is_table(path)
    except READ_ERRORS:  # a path that is a file, or that cannot be listed: no table there
        return False


def resolve_table(name: str, lake: str | None, *, confined: bool = False) -> TableRef:
    """``page_views.aggregates`` (under the lake root ``lake``) or, unless ``confined``, a path to a Delta table.
    ``confined`` (the web view): qualified names only, resolving inside ``lake`` (no ``..``, no symlinks out).
    InspectError for a path where only names are accepted, or a table outside the lake; LakeError for no table."""
    match = _QUALIFIED.match(name)
    if match and (confined or not Path(name).exists()):
        pipeline, table = match.groups()
        if not is_table_name(table):
            raise LakeError(f"unknown table {table!r} in {name!r}; tables are {', '.join(TABLES)} and the "
                            "declared rollups' rollup_<name>")
        if lake is None:
            raise LakeError(f"{name!r} needs the lake root: pass --lake DIR or --pipeline SPEC, or set ${LAKE_ENV}")
        path = os.path.join(lake, pipeline, table)
        if not _inside(path, lake):
            raise InspectError(f"table {name!r} resolves outside the lake root {lake}; it is not shown")
        if not is_delta(path):
            known = ", ".join(sorted({r["table"].split(".")[0] for r in _pipelines(lake)})) or "none"
            raise LakeError(f"no Delta table {name} at {path} (pipelines in {lake}: {known}); "
                            "list the tables with: python -m spark_jobs inspect tables")
        return TableRef(name, path, pipeline, table)
    if confined:
        raise InspectError(f"bad table name {name[:200]!r}; use <pipeline>.<table>, e.g. page_views.aggregates "
                           f"(tables are {', '.join(TABLES)}); paths are not accepted here")
    if not is_delta(name):
        raise LakeError(f"no Delta table at {name}; name a table as <pipeline>.<table> (e.g. page_views.aggregates) "
                        "or give the path of a Delta table; list them with: python -m spark_jobs inspect tables")
    parts = Path(os.path.abspath(name)).parts
    table = parts[-1] if is_table_name(parts[-1]) else None
    pipeline = parts[-2] if table and len(parts) > 1 else None
    return TableRef(name, name, pipeline, table)


def _latest(ref: TableRef) -> Snapshot:
    try:
        return open_table(ref.path)
    except READ_ERRORS as exc:
        raise LakeError(f"cannot read Delta table {ref.name} at {ref.path}: {exc}") from exc


def parse_time(text: str) -> dt.datetime:
    """``YYYY-MM-DD[ HH:MM[:SS]]`` (UTC unless an offset is given) as an aware datetime."""
    if not TIME_PATTERN.match(text.strip()):
        raise InspectError(f"bad time {text[:100]!r}; use 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM:SS' (UTC), "
                           "e.g. '2024-03-01 12:00:00'")
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise InspectError(f"bad time {text!r}: {exc}") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def versions(ref: TableRef) -> pa.Table:
    """Every version of the table still in its log, newest first: version, committed_at, operation."""
    rows = sorted(({"version": int(h["version"]), "committed_at": commit_time(h), "operation": h.get("operation", "")}
                   for h in _latest(ref).history()), key=lambda r: -r["version"])
    return _arrow(rows, version=pa.int64(), committed_at=pa.timestamp("ms", tz="UTC"), operation=pa.string())


def open_version(ref: TableRef, *, version: int | None = None, as_of: str | None = None) -> Snapshot:
    """The table at ``version``, at the last commit at or before ``as_of``, or its latest version; InspectError
    when both are given, for a version out of range, or a time before the first commit."""
    if version is not None and as_of is not None:
        raise InspectError("give either a version or an as-of time, not both")
    latest = _latest(ref)
    if as_of is not None:
        at = parse_time(as_of)
        if (version := latest.version_at(at)) is None:
            history = sorted(latest.history(), key=lambda h: int(h["version"]))
            first = commit_time(history[0]).strftime("%Y-%m-%d %H:%M:%S") if history else "unknown"
            raise InspectError(f"{ref.name} has no version at or before {at:%Y-%m-%d %H:%M:%S} UTC; "
                               f"its first commit is at {first} UTC")
    last = latest.version()
    if version is None or version == last:
        return latest
    if version < 0 or version > last:
        raise InspectError(f"version {version} of {ref.name} does not exist; its versions are 0..{last}")
    try:
        return latest.at(version)
    except READ_ERRORS as exc:
        raise InspectError(f"version {version} of {ref.name} can no longer be read (its log or files were "
                           f"cleaned up): {exc}; list readable versions with: inspect history {ref.name}") from exc


def _pipelines(lake: str) -> list[dict[str, str]]:
    root = Path(lake)
    out: list[dict[str, str]] = []
    if not root.is_dir():
        return out
    for pipeline in sorted(p for p in root.iterdir() if p.is_dir() and re.fullmatch(_PIPELINE, p.name)):
        if not _inside(pipeline, root):
            continue  # a symlink out of the lake: never followed
        rollups = sorted(p.name for p in pipeline.iterdir() if p.is_dir() and is_table_name(p.name)
                         and p.name not in TABLES)
        for table in (*TABLES, *rollups):
            path = pipeline / table
            if _inside(path, root) and is_delta(str(path)):
                out.append({"table": f"{pipeline.name}.{table}", "path": str(path)})
    return out


def list_tables(lake: str, *, pipeline: str | None = None) -> pa.Table:
    """Every pipeline table under ``lake`` (or one pipeline's), one row each."""
    _lake_dir(lake)
    rows = []
    for entry in (e for e in _pipelines(lake) if pipeline in (None, e["table"].split(".")[0])):
        try:
            table = open_table(entry["path"])
            actions, last = table.add_actions(), table.history(1)[0]
            n_rows, size = (int(pc.sum(actions[c]).as_py() or 0) if actions.num_rows else 0
                            for c in ("num_records", "size_bytes"))
            rows.append({"table": entry["table"], "version": table.version(), "rows": n_rows, "files": actions.num_rows,
                         "bytes": size, "last_commit": commit_time(last).strftime("%Y-%m-%d %H:%M:%S"),
                         "operation": last.get("operation", ""), "path": entry["path"]})
        except READ_ERRORS as exc:
            raise LakeError(f"cannot read Delta table {entry['table']} at {entry['path']}: {exc}") from exc
    return _arrow(rows, table=pa.string(), version=pa.int64(), rows=pa.int64(), files=pa.int64(), bytes=pa.int64(),
                  last_commit=pa.string(), operation=pa.string(), path=pa.string())


def _consumed(commit: dict[str, Any], change: CommitChange) -> str:
    """The commit's app transactions (guards left out) and the inputs its commit info records."""
    txns = [t for t in change.app_txns if not t.app_id.startswith(GUARD_PREFIX)]
    parts = [f"txn {t.app_id}={t.version}" for t in txns]
    raw = commit.get("inputs")
    try:
        inputs = json.loads(raw) if isinstance(raw, str) else (raw or [])
    except ValueError:
        inputs = [raw]
    parts.extend(os.path.basename(str(i).rstrip("/")) for i in inputs if i)
    if "partials_consumed" in commit and not txns:
        parts.append(f"partials v{commit['partials_consumed']}")
    return "; ".join(parts)


def history(ref: TableRef, *, limit: int | None = None) -> pa.Table:
    """One row per commit, newest first: time, operation, run, files and rows added/removed (as
    :meth:`Snapshot.commit_changes` counts them), what it consumed: its Delta app transactions (``txn <app
    id>=<input version>``, e.g. the ``partials`` version a reduce merged) and recorded inputs (a landing partition)."""
    latest = _latest(ref)
    entries = sorted(latest.history(limit), key=lambda h: int(h["version"]), reverse=True)
    changes = {c.version: c for c in latest.commit_changes(int(entries[-1]["version"]))} if entries else {}
    rows = []
    for entry in entries:
        c = changes.get(v := int(entry["version"])) or CommitChange(v)
        rows.append({"version": v, "committed_at": commit_time(entry), "operation": entry.get("operation", ""),
                     "run_id": entry.get("run_id"), "job": entry.get("job"), "batch": entry.get("batch"),
                     "files_added": c.files_added, "files_removed": c.files_removed, "rows_added": c.rows_added,
                     "rows_removed": c.rows_removed, "consumed": _consumed(entry, c)})
    i64, text = pa.int64(), pa.string()
    return _arrow(rows, version=i64, committed_at=pa.timestamp("ms", tz="UTC"), operation=text, run_id=text, job=text,
                  batch=text, files_added=i64, files_removed=i64, rows_added=i64, rows_removed=i64, consumed=text)


def _check_columns(ref: TableRef, schema: pa.Schema, columns: Sequence[str], what: str = "columns") -> None:
    if unknown := [c for c in columns if c not in schema.names]:
        raise InspectError(f"unknown {what} {', '.join(repr(c) for c in unknown)} in {ref.name}; "
                           f"columns are {', '.join(schema.names)}")


def column_list(text: str | None, option: str) -> list[str] | None:
    """``page,views`` (the CLI's or the web view's ``option``) as column names; None when not given."""
    if text is None:
        return None
    cols = [c.strip() for c in text.split(",")]
    if not all(cols):
        raise InspectError(f"bad {option} {text!r}; use comma-separated column names, e.g. page,views")
    return cols


def sort_keys(text: str | None) -> list[tuple[str, str]] | None:
    """``column[:asc|desc][,column...]`` (``--order-by``) as the ``order_by`` of :func:`show`."""
    if not text:
        return None
    out = []
    for part in text.split(","):
        col, _, direction = part.strip().partition(":")
        if not col or direction not in ("", "asc", "desc"):
            raise InspectError(f"bad --order-by {text!r}; use column or column:desc, e.g. views:desc")
        out.append((col, "descending" if direction == "desc" else "ascending"))
    return out


def show(ref: TableRef, *, version: int | None = None, as_of: str | None = None,
         where: str | None = None, columns: Sequence[str] | None = None, limit: int = 20,
         order_by: Sequence[tuple[str, str]] | None = None) -> pa.Table:
    """Rows of a table (at a version or time), filtered by ``where``; accumulator columns left out unless asked.
    ``order_by``: ``(column, "ascending" | "descending")`` pairs, applied before ``limit``."""
    table = open_version(ref, version=version, as_of=as_of)
    schema = table.schema()
    _check_columns(ref, schema, columns or [])
    columns = list(columns) if columns else [f.name for f in schema if "__" not in f.name]
    _check_columns(ref, schema, [c for c, _ in order_by or []], "order-by column")
    expr = parse_where(where, schema) if where is not None else None
    if not order_by:
        return table.head(limit, columns=columns, filter=expr)
    rows = table.read(list(dict.fromkeys([*columns, *(c for c, _ in order_by)])), filter=expr)
    return rows.sort_by(list(order_by)).slice(0, limit).select(columns)


def _plain(t: pa.DataType) -> bool:
    return not (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_nested(t)
                or pa.types.is_fixed_size_binary(t))


def table_keys(ref: TableRef, table_schema: pa.Schema, *, spec: PipelineSpec | None = None,
               keys: Sequence[str] | None = None) -> list[str]:
    """The columns that identify a row, for ``diff``: ``keys`` when given; else from the spec (``aggregates``:
    group keys and window bounds, ``partials``: batch, source, event_date and those); ``runs``: run_id; else the
    leading columns that are neither numeric, binary nor nested (the keys of a table this project writes)."""
    if keys:
        _check_columns(ref, table_schema, keys, "key columns")
        return list(keys)
    if spec is not None and (ref.pipeline in (None, spec.name)):
        if ref.table == "aggregates":
            return list(spec.key_columns)
        if ref.table == "partials":
            return ["batch", "source", "event_date", *spec.key_columns]
    if ref.table == "runs" and "run_id" in table_schema.names:
        return ["run_id"]
    leading = takewhile(lambda f: _plain(f.type) and not (is_number(f.type) or pa.types.is_boolean(f.type)),
                        (f for f in table_schema if f.name not in BOOKKEEPING))
    if out := [f.name for f in leading]:
        return out
    raise InspectError(f"cannot tell the key columns of {ref.name}; pass --keys col1,col2 "
                       "(or --pipeline SPEC for a pipeline table)")


def schema(ref: TableRef, *, version: int | None = None, spec: PipelineSpec | None = None) -> pa.Table:
    """Columns with type, nullability and role (key, partition, value, accumulator, metadata)."""
    table = open_version(ref, version=version)
    s = table.schema()
    parts = set(table.partition_columns)
    try:
        keys = set(table_keys(ref, s, spec=spec))
    except InspectError:
        keys = set()
    rows = []
    for f in s:
        roles = ([r for r, hit in (("key", f.name in keys), ("partition", f.name in parts)) if hit]
                 or ["accumulator" if "__" in f.name else "metadata" if f.name in BOOKKEEPING else "value"])
        rows.append({"column": f.name, "type": str(f.type), "nullable": f.nullable, "role": ", ".join(roles)})
    return _arrow(rows, column=pa.string(), type=pa.string(), nullable=pa.bool_(), role=pa.string())


def partitions(ref: TableRef, *, version: int | None = None) -> pa.Table:
    """Files, rows and bytes per partition (one row in all for an unpartitioned table)."""
    table = open_version(ref, version=version)
    cols = table.partition_columns
    groups: dict[tuple[Any, ...], list[int]] = {}
    for f in table.add_actions().to_pylist():
        values = (f[f"partition.{c}"] for c in cols)
        acc = groups.setdefault(tuple(None if v is None else str(v) for v in values), [0, 0, 0])
        acc[:] = acc[0] + 1, acc[1] + int(f["num_records"] or 0), acc[2] + int(f["size_bytes"] or 0)
    rows = [{**dict(zip(cols, k, strict=True)), "files": a[0], "rows": a[1], "bytes": a[2]}
            for k, a in sorted(groups.items(), key=lambda kv: tuple("" if x is None else x for x in kv[0]))]
    return _arrow(rows, *((c, pa.string()) for c in cols), files=pa.int64(), rows=pa.int64(), bytes=pa.int64())


@dataclass(frozen=True)
class TableDiff:
    """What changed between two versions of a table, by key: ``added`` holds the new rows, ``removed`` the old
    ones, ``changed`` the keys with each compared column as ``<column>.old`` and ``<column>.new`` plus
    ``changed_columns``. Counts are totals; the tables hold at most ``limit`` rows each, sorted by key."""

    table: str
    from_version: int
    to_version: int
    keys: list[str]
    compared: list[str]
    added: pa.Table
    removed: pa.Table
    changed: pa.Table
    n_added: int
    n_removed: int
    n_changed: int
    n_unchanged: int
    columns_added: list[str]
    columns_removed: list[str]


def _side(ref: TableRef, table: Snapshot, version: int, keys: list[str], compared: list[str], suffix: str) -> pa.Table:
    """The keys (checked unique) and the compared columns as ``<column>.<suffix>``, flagged ``_in_<suffix>``."""
    rows = table.read([*keys, *compared])
    counts = rows.group_by(keys).aggregate([([], "count_all")])
    dupes = counts.filter(pc.greater(counts["count_all"], 1))
    if dupes.num_rows:
        sample = {k: dupes[k][0].as_py() for k in keys}
        raise InspectError(f"the keys ({', '.join(keys)}) are not unique in version {version} of {ref.name}: "
                           f"{dupes.num_rows} keys have several rows, e.g. {sample}; pass --keys with more columns")
    return rows.rename_columns([*keys, *(f"{c}.{suffix}" for c in compared)]).append_column(
        f"_in_{suffix}", pa.array([True] * rows.num_rows, pa.bool_()))


def _differs(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    one_null = pc.xor(pc.is_null(a), pc.is_null(b))
    if pa.types.is_floating(a.type) or pa.types.is_floating(b.type):
        fa, fb = pc.cast(a, pa.float64()), pc.cast(b, pa.float64())
        tol = pc.multiply(pc.max_element_wise(pc.abs(fa), pc.abs(fb)), 1e-9)
        close = pc.less_equal(pc.abs(pc.subtract(fa, fb)), tol)
        both_nan = pc.and_(pc.is_nan(fa), pc.is_nan(fb))
        unequal = pc.invert(pc.or_(pc.fill_null(close, True), pc.fill_null(both_nan, False)))
    else:
        unequal = pc.fill_null(pc.not_equal(a, b), False)
    return pc.or_(one_null, unequal)


def diff(ref: TableRef, *, from_version: int, to_version: int | None = None, keys: Sequence[str] | None = None,
         spec: PipelineSpec | None = None, limit: int = 20) -> TableDiff:
    """Keys added, removed and changed (with old and new values) from ``from_version`` to ``to_version``.

    Compared: every column in both versions but the keys, the bookkeeping columns and binary or nested columns
    (sketches and struct accumulators: their results are compared through the value columns). Floats count as
    changed beyond a relative difference of 1e-9.
    """
    old_t = open_version(ref, version=from_version)
    new_t = open_version(ref, version=to_version)
    to_v = new_t.version()
    old_s, new_s = old_t.schema(), new_t.schema()
    key_cols = table_keys(ref, new_s, spec=spec, keys=keys)
    if missing := [k for k in key_cols if k not in old_s.names]:
        raise InspectError(f"key columns {missing} are not in version {from_version} of {ref.name}; "
                           "pass --keys with columns both versions have")
    compared = [f.name for f in new_s if f.name in old_s.names and f.name not in key_cols
                and f.name not in BOOKKEEPING and _plain(f.type) and _plain(old_s.field(f.name).type)]
    old = _side(ref, old_t, from_version, key_cols, compared, "old")
    joined = arrow_join(old, _side(ref, new_t, to_v, key_cols, compared, "new"), key_cols, "full outer")
    in_old, in_new = pc.is_valid(joined["_in_old"]), pc.is_valid(joined["_in_new"])

    def only(present: pa.ChunkedArray, suffix: str) -> pa.Table:  # the rows of one version only, by key
        rows = joined.filter(pc.invert(present)).select([*key_cols, *(f"{c}.{suffix}" for c in compared)])
        return rows.rename_columns([*key_cols, *compared]).sort_by([(k, "ascending") for k in key_cols])

    added, removed = only(in_old, "new"), only(in_new, "old")
    both = joined.filter(pc.and_(in_old, in_new))
    changed, n_changed = _changed(both, key_cols, compared, limit)
    return TableDiff(table=ref.name, from_version=old_t.version(), to_version=to_v, keys=key_cols, compared=compared,
                     added=added.slice(0, limit), removed=removed.slice(0, limit), changed=changed,
                     n_added=added.num_rows, n_removed=removed.num_rows, n_changed=n_changed,
                     n_unchanged=both.num_rows - n_changed,
                     columns_added=[c for c in new_s.names if c not in old_s.names],
                     columns_removed=[c for c in old_s.names if c not in new_s.names])


def _changed(both: pa.Table, key_cols: list[str], compared: list[str], limit: int) -> tuple[pa.Table, int]:
    """The first ``limit`` keys in both versions whose compared columns differ (which ones), and how many in all."""
    cols = [*key_cols, *(f"{c}.{side}" for c in compared for side in ("old", "new"))]
    flagged, any_change = both.select(cols), pa.chunked_array([pa.array([False] * both.num_rows, pa.bool_())])
    for c in compared:
        mask = _differs(both[f"{c}.old"], both[f"{c}.new"])
        flagged, any_change = flagged.append_column(f"_differs.{c}", mask), pc.or_(any_change, mask)
    rows = flagged.filter(any_change).sort_by([(k, "ascending") for k in key_cols]).slice(0, limit)
    flags = [rows[f"_differs.{c}"].to_pylist() for c in compared]
    changed_cols = [[c for c, f in zip(compared, flags, strict=True) if f[i]] for i in range(rows.num_rows)]
    changed = rows.select(cols).append_column("changed_columns", pa.array(changed_cols, pa.list_(pa.string())))
    return changed, int(pc.sum(any_change).as_py() or 0)


def _compact_versions(raw: str | None) -> str:
    try:
        data = json.loads(raw or "{}")
    except ValueError:
        return raw or ""
    return ", ".join(f"{k} v{v}" if v is not None else f"{k} -" for k, v in data.items())


def _run_row(r: dict[str, Any], pipeline: str, dead: dict[str, int]) -> dict[str, Any]:
    """One recorded run as ``runs`` shows it (``dead``: dead-letter rows per run id)."""
    n_in, n_agg, n_rej = r.get("rows_in"), r.get("rows_aggregated"), r.get("rows_rejected")
    return {**{k: r.get(k) for k in ("run_id", "job", "batch", "status", "started_at", "rows_in", "rows_aggregated",
                                      "rows_rejected")},
            **{k: r.get(k) or 0 for k in ("files_quarantined", "files_skipped")},
            "pipeline": r.get("pipeline") or pipeline, "message": r.get("message") or "",
            "duration_s": None if r.get("duration_s") is None else round(r["duration_s"], 2),
            "attempts": r.get("attempts") or 1,  # runs recorded before attempts were counted made one
            "reconciles": None if n_in is None or n_agg is None or n_rej is None else n_in == n_agg + n_rej,
            "dead_letter_rows": dead.get(r.get("run_id") or "", 0),
            "read": _compact_versions(r.get("versions_read")), "wrote": _compact_versions(r.get("versions_written"))}


def runs(lake: str, *, pipeline: str | None = None, limit: int | None = None) -> pa.Table:
    """Every job run recorded in the lake (or one pipeline's), oldest first (the last ``limit``). ``reconciles``
    is rows in = rows aggregated + rows rejected; ``dead_letter_rows`` is how many rejected rows and quarantined
    files of the run are in ``dead_letter`` now (a rerun of the same day replaces them)."""
    if pipeline is not None and not re.fullmatch(_PIPELINE, pipeline):
        raise InspectError(f"bad pipeline name {pipeline[:100]!r}; pipeline names match [a-z][a-z0-9_]*")
    _lake_dir(lake)
    entries = [e for e in _pipelines(lake) if e["table"].endswith(".runs")
               and pipeline in (None, e["table"].removesuffix(".runs"))]
    if pipeline is not None and not entries:
        raise LakeError(f"no runs table for pipeline {pipeline!r} under {lake}; run a job of it first")
    rows: list[dict[str, Any]] = []
    for entry in entries:
        name = entry["table"].split(".")[0]
        try:
            recorded = read_runs(entry["path"])
        except READ_ERRORS as exc:
            raise LakeError(f"cannot read {entry['table']}: {exc}") from exc
        dl_path = os.path.join(os.path.dirname(entry["path"]), "dead_letter")
        dead = dead_letter_rows_by_run(dl_path) if _inside(dl_path, lake) and is_delta(dl_path) else {}
        rows.extend(_run_row(r, name, dead) for r in recorded)
    rows.sort(key=lambda r: (r["started_at"] or dt.datetime.min.replace(tzinfo=dt.UTC), r["run_id"] or ""))
    i64, text = pa.int64(), pa.string()
    return _arrow(rows if limit is None else rows[-limit:], run_id=text, pipeline=text, job=text, batch=text,
                  status=text, started_at=pa.timestamp("us", tz="UTC"), duration_s=pa.float64(), attempts=i64,
                  rows_in=i64, rows_aggregated=i64, rows_rejected=i64, reconciles=pa.bool_(), files_quarantined=i64,
                  files_skipped=i64, dead_letter_rows=i64, read=text, wrote=text, message=text)


@dataclass(frozen=True)
class Series:
    """One aggregate over windows: a line per key (the ``max_lines`` keys with the largest totals)."""

    table: str
    version: int
    metric: str
    keys: list[str]
    lines: list[tuple[str, list[tuple[dt.datetime, float | None]]]]
    n_keys: int  # keys matched; ``len(lines)`` of them are drawn

    @classmethod
    def of(cls, rows: pa.Table, *, table: str, version: int, metric: str, keys: Sequence[str], x: str,
           max_lines: int) -> Series:
        """``metric`` over ``x``, a line per ``keys`` combination: the ``max_lines`` with the largest totals."""
        labels = ([", ".join(f"{k}={'NULL' if v is None else v}" for k, v in zip(keys, vals, strict=True))
                   for vals in zip(*(rows[k].to_pylist() for k in keys), strict=True)]
                  if keys else ["all"] * rows.num_rows)
        by_label: dict[str, list[tuple[dt.datetime, float | None]]] = {}
        for label, at, y in zip(labels, rows[x].to_pylist(), rows[metric].to_pylist(), strict=True):
            by_label.setdefault(label, []).append((at, None if y is None else float(y)))
        chosen = sorted(by_label, key=lambda lb: (-sum(v or 0.0 for _, v in by_label[lb]), lb))[:max_lines]
        lines = [(lb, sorted(by_label[lb], key=lambda p: p[0])) for lb in sorted(chosen)]
        return cls(table, version, metric, list(keys), lines, len(by_label))


def series(ref: TableRef, *, metric: str, version: int | None = None, where: str | None = None,
           max_lines: int = 6, max_points: int = 5000) -> Series:
    """A numeric column of a windowed table over ``window_start``, one line per group key."""
    table = open_version(ref, version=version)
    s = table.schema()
    if "window_start" not in s.names:
        raise InspectError(f"{ref.name} has no window_start column; charts need a windowed aggregates table")
    _check_columns(ref, s, [metric], "metric")
    if not is_number(t := s.field(metric).type):
        numeric = [f.name for f in s if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
        raise InspectError(f"metric {metric!r} is {t}, not a number; numeric columns are {', '.join(numeric)}")
    keys = [k for k in table_keys(ref, s) if k not in ("window_start", "window_end")]
    rows = table.read([*keys, "window_start", metric], filter=parse_where(where, s) if where is not None else None)
    if rows.num_rows > max_points * max(1, max_lines):
        raise InspectError(f"{rows.num_rows} points match; narrow the filter (e.g. a window_start range)")
    return Series.of(rows, table=ref.name, version=table.version(), metric=metric, keys=keys, x="window_start",
                     max_lines=max_lines)


def coverage(spec: PipelineSpec, record: RecordedSpec) -> pa.Table:
    """Per aggregate: the spec version it is covered from, and the event days whose partials hold it or not
    (an aggregate is NULL in the windows of the days it is not covered by, until they are recombined)."""
    from spark_jobs.lake.coverage import day_versions
    from spark_jobs.spec_plan import pending_days

    versions = day_versions(PipelineTables(spec.lake, spec.name).partials)
    layout = set(pending_days(spec, record)) - set(versions)  # days a layout change dropped, not recombined
    rows = []
    for agg in spec.aggregates:
        since = record.since(agg.name)
        covered = [d for d, v in versions.items() if v >= since]
        missing = sorted({d for d, v in versions.items() if v < since} | layout)
        rows.append({"aggregate": agg.name, "since_version": since, "days_covered": len(covered),
                     "covered": _day_ranges(covered), "days_uncovered": len(missing), "uncovered": _day_ranges(missing)})
    return _arrow(rows, aggregate=pa.string(), since_version=pa.int64(), days_covered=pa.int64(), covered=pa.string(),
                  days_uncovered=pa.int64(), uncovered=pa.string())


def _day_ranges(days: Sequence[str]) -> str:
    """``2024-03-01..2024-03-03, 2024-03-05``: consecutive days as ranges."""
    from spark_jobs.spec_plan import day_ranges

    return ", ".join(first if first == last else f"{first}..{last}" for first, last in day_ranges(days))


def spec_versions(lake: str, pipeline: str) -> pa.Table:
    """Every step of the lake's spec record, oldest first: version, status, when, the changes, the spec."""
    from spark_jobs.lake.spec_record import read_records

    rows = [{"version": r.version, "status": r.status, "recorded_at": r.recorded_at, "run_id": r.run_id,
             "changes": "; ".join(c.get("what", "") for c in r.changes) or ("first spec" if r.version == 1 else ""),
             "spec": json.dumps(r.spec, sort_keys=True)} for r in read_records(lake, pipeline)]
    return _arrow(rows, version=pa.int64(), status=pa.string(), recorded_at=pa.timestamp("us", tz="UTC"),
                  run_id=pa.string(), changes=pa.string(), spec=pa.string())
