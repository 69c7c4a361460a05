"""Aligned text tables for terminals and JSON for scripts, from the views' Arrow tables and diffs."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from typing import Any

import pyarrow as pa

from spark_jobs.inspection.views import TableDiff, is_number

__all__ = ["cell", "diff_to_dict", "human_bytes", "jsonable", "to_json", "to_text"]

MAX_CELL = 80


def human_bytes(n: int | None) -> str:
    if n is None:
        return ""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


def cell(value: Any, *, width: int | None = MAX_CELL) -> str:
    """One value as text: NULL, short floats, UTC times without zone, bytes as their size."""
    if value is None:
        text = "NULL"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = f"{value:.6g}" if abs(value) < 1e15 else f"{value:.6e}"
    elif isinstance(value, dt.datetime):
        text = value.strftime("%Y-%m-%d %H:%M:%S")
    elif isinstance(value, bytes):
        text = f"<{len(value)} bytes>"
    elif isinstance(value, (list, dict)):
        text = json.dumps(jsonable(value), separators=(",", ":"))
    else:
        text = str(value)
    text = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", " ")
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def _grid(header: list[str], rows: list[list[str]], numeric: list[bool]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _table_text(table: pa.Table) -> str:
    if table.num_rows == 0:
        return "(no rows)"
    rows = [[cell(v) for v in row.values()] for row in table.to_pylist()]
    return _grid(table.column_names, rows, [is_number(f.type) for f in table.schema])


def _diff_text(d: TableDiff) -> str:
    out = [f"diff {d.table} version {d.from_version} -> {d.to_version} (keys: {', '.join(d.keys)})",
           f"  added {d.n_added}, removed {d.n_removed}, changed {d.n_changed}, unchanged {d.n_unchanged}"]
    if d.columns_added or d.columns_removed:
        out.append(f"  columns added: {', '.join(d.columns_added) or '-'}; removed: {', '.join(d.columns_removed) or '-'}")
    for title, rows, n in (("added", d.added, d.n_added), ("removed", d.removed, d.n_removed)):
        if n:
            more = f", first {rows.num_rows}" if rows.num_rows < n else ""
            out += ["", f"{title} ({n}{more}):", _table_text(rows)]
    if d.n_changed:
        shown = [c for c in d.compared if any(c in cols for cols in d.changed["changed_columns"].to_pylist())]
        body = [[cell(row[k]) for k in d.keys]
                + [f"{cell(row[f'{c}.old'], width=30)} -> {cell(row[f'{c}.new'], width=30)}"
                   if c in row["changed_columns"] else "" for c in shown] for row in d.changed.to_pylist()]
        more = f", first {d.changed.num_rows}" if d.changed.num_rows < d.n_changed else ""
        out += ["", f"changed ({d.n_changed}{more}):", _grid([*d.keys, *shown], body, [False] * (len(d.keys) + len(shown)))]
    if not (d.n_added or d.n_removed or d.n_changed):
        out += ["", f"no differences in the compared columns ({', '.join(d.compared) or 'none'})"]
    return "\n".join(out)


def to_text(result: pa.Table | TableDiff) -> str:
    """An aligned, human-readable table (numbers right-aligned, long cells cut with …)."""
    return _diff_text(result) if isinstance(result, TableDiff) else _table_text(result)


def jsonable(value: Any) -> Any:
    """A value JSON can carry: ISO 8601 times, base64 bytes, null for NaN and infinities."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    return str(value) if isinstance(value, decimal.Decimal) else value


def diff_to_dict(d: TableDiff) -> dict[str, Any]:
    changed = [{"key": {k: row[k] for k in d.keys},
                **{side: {c: row[f"{c}.{side}"] for c in row["changed_columns"]} for side in ("old", "new")}}
               for row in d.changed.to_pylist()]
    return jsonable({
        "table": d.table, "from_version": d.from_version, "to_version": d.to_version, "keys": d.keys,
        "compared": d.compared,
        "counts": {"added": d.n_added, "removed": d.n_removed, "changed": d.n_changed, "unchanged": d.n_unchanged},
        "columns_added": d.columns_added, "columns_removed": d.columns_removed,
        "added": d.added.to_pylist(), "removed": d.removed.to_pylist(), "changed": changed})


def to_json(result: pa.Table | TableDiff) -> str:
    """Rows as a JSON list of objects (a diff as one object); times in ISO 8601."""
    data = diff_to_dict(result) if isinstance(result, TableDiff) else jsonable(result.to_pylist())
    return json.dumps(data, indent=1, allow_nan=False)
