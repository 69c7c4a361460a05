"""Aligned text tables for terminals; ``--json`` output for scripts."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa

__all__ = ["to_json", "to_text"]


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else f"{value:.6e}"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


def to_text(table: pa.Table) -> str:
    if table.num_rows == 0:
        return "(no rows)"
    rows = [[_cell(v) for v in row.values()] for row in table.to_pylist()]
    widths = [max(len(name), *(len(r[i]) for r in rows)) for i, name in enumerate(table.column_names)]
    numeric = [pa.types.is_integer(f.type) or pa.types.is_floating(f.type) for f in table.schema]
    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric, strict=False)).rstrip()
    out = [line(table.column_names), line(["-" * w for w in widths])]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def to_json(table: pa.Table) -> str:
    return json.dumps(table.to_pylist(), default=_cell, indent=1)
