"""Views of Delta tables as Arrow tables: what the CLI prints and the web page renders."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from spark_jobs.errors import LakeError
from spark_jobs.lake.tables import TABLES

__all__ = ["TableRef", "list_tables", "resolve_table", "show", "table_summary"]

_QUALIFIED = re.compile(r"^([a-z][a-z0-9_]*)\.([a-z_]+)$")


@dataclass(frozen=True)
class TableRef:
    name: str  # pipeline.table, or the path when given as a path
    path: str


def resolve_table(name: str, lake: str | None) -> TableRef:
    """``page_views.aggregates`` (under ``lake``) or a path to a Delta table."""
    match = _QUALIFIED.match(name)
    if match and not Path(name).exists():
        if match.group(2) not in TABLES:
            raise LakeError(f"unknown table {match.group(2)!r} in {name!r}; tables are {', '.join(TABLES)}")
        if lake is None:
            raise LakeError(f"{name!r} needs the lake root: pass --lake DIR or --pipeline SPEC")
        path = str(Path(lake) / match.group(1) / match.group(2))
    else:
        path = name
    if not DeltaTable.is_deltatable(path):
        raise LakeError(f"no Delta table at {path}; list the lake's tables with: python -m spark_jobs inspect tables")
    return TableRef(name, path)


def table_summary(path: str) -> dict[str, object]:
    dt_ = DeltaTable(path)
    actions = pa.table(dt_.get_add_actions(flatten=True))
    last = dt_.history(1)[0]
    return {
        "version": dt_.version(),
        "rows": int(pa.compute.sum(actions["num_records"]).as_py() or 0) if actions.num_rows else 0,
        "files": actions.num_rows,
        "bytes": int(pa.compute.sum(actions["size_bytes"]).as_py() or 0) if actions.num_rows else 0,
        "last_commit": dt.datetime.fromtimestamp(last["timestamp"] / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "operation": last.get("operation", ""),
    }


def list_tables(lake: str) -> pa.Table:
    """Every pipeline table under ``lake``, one row each."""
    rows = []
    root = Path(lake)
    if not root.is_dir():
        raise LakeError(f"lake root {lake} does not exist; run a pipeline first or pass the right --lake")
    for pipeline in sorted(p for p in root.iterdir() if p.is_dir()):
        for table in TABLES:
            path = pipeline / table
            if DeltaTable.is_deltatable(str(path)):
                rows.append({"table": f"{pipeline.name}.{table}", **table_summary(str(path)), "path": str(path)})
    return pa.Table.from_pylist(rows)


def show(ref: TableRef, *, version: int | None = None, columns: list[str] | None = None, limit: int = 20,
         order_by: list[tuple[str, str]] | None = None) -> pa.Table:
    """Rows of a table (at a version); binary accumulator columns are left out unless asked for."""
    dt_ = DeltaTable(ref.path, version=version) if version is not None else DeltaTable(ref.path)
    schema = pa.schema(dt_.schema().to_arrow())
    if columns:
        unknown = [c for c in columns if c not in schema.names]
        if unknown:
            raise LakeError(f"unknown columns {unknown} in {ref.name}; columns are {', '.join(schema.names)}")
    else:
        columns = [f.name for f in schema if "__" not in f.name]
    for col, _ in order_by or []:
        if col not in schema.names:
            raise LakeError(f"cannot order by {col!r}: not a column of {ref.name}")
    dataset = dt_.to_pyarrow_dataset()
    if not order_by:
        return dataset.head(limit, columns=columns)
    table = dataset.to_table(columns=sorted(set(columns) | {c for c, _ in order_by}))
    return table.sort_by(order_by).slice(0, limit).select(columns)
