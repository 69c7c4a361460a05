"""``python -m spark_jobs inspect ...``: argument parsing and printing only."""

from __future__ import annotations

import argparse
from typing import Any

from spark_jobs.errors import LakeError

__all__ = ["add_inspect_parser", "run_inspect"]


def add_inspect_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("inspect", help="read-only views of the Delta tables (no Spark)")
    p.add_argument("view", choices=["tables", "show"])
    p.add_argument("table", nargs="?", help="pipeline.table (e.g. page_views.aggregates) or a table path")
    p.add_argument("--lake", help="lake root")
    p.add_argument("--pipeline", help="pipeline spec: its lake root is used")
    p.add_argument("--version", type=int, help="time travel: read this table version")
    p.add_argument("--columns", help="comma-separated columns to show")
    p.add_argument("--order-by", help="column[:desc] to sort by before --limit")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true", help="JSON output for scripts")
    return p


def _lake(args: argparse.Namespace) -> str | None:
    if args.lake:
        return str(args.lake)
    if args.pipeline:
        from spark_jobs.spec import load_spec

        return load_spec(args.pipeline).lake
    return None


def run_inspect(args: argparse.Namespace) -> int:
    from spark_jobs.inspect.render import to_json, to_text
    from spark_jobs.inspect.views import list_tables, resolve_table, show

    lake = _lake(args)
    if args.view == "tables":
        if lake is None:
            raise LakeError("inspect tables needs --lake DIR or --pipeline SPEC")
        result = list_tables(lake)
    else:
        if not args.table:
            raise LakeError("inspect show needs a table, e.g. page_views.aggregates")
        if args.limit < 1:
            raise LakeError(f"--limit must be >= 1, got {args.limit}")
        order = None
        if args.order_by:
            col, _, direction = args.order_by.partition(":")
            if direction not in ("", "asc", "desc"):
                raise LakeError(f"bad --order-by {args.order_by!r}; use column or column:desc")
            order = [(col, "descending" if direction == "desc" else "ascending")]
        columns = [c.strip() for c in args.columns.split(",")] if args.columns else None
        result = show(resolve_table(args.table, lake), version=args.version, columns=columns, limit=args.limit,
                      order_by=order)
    print(to_json(result) if args.json else to_text(result))
    return 0
