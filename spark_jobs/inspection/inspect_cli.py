"""``python -m spark_jobs inspect <view> ...``: argument parsing and printing only.

The views live in :mod:`spark_jobs.inspection.views`; errors surface through the CLI's error
mapping (``error: ...`` and a non-zero exit code), and nothing is ever written.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_jobs.errors import InspectError, LakeError

if TYPE_CHECKING:
    from spark_jobs.lake.spec_record import RecordedSpec
    from spark_jobs.spec import PipelineSpec

__all__ = ["add_inspect_parser", "run_inspect"]

TABLE_HELP = "pipeline.table (e.g. page_views.aggregates) or the path of a Delta table"
PIPELINE_HELP = ("a pipeline name (the spec its lake records, e.g. page_views) or a spec file (a path, e.g. "
                 "pipelines/page_views.yaml)")
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def add_inspect_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``inspect`` and its views to the command line's subparsers; the caller sets its ``func``."""
    p = sub.add_parser("inspect", help="read-only views of the Delta tables (delta-rs, no Spark)",
                       description="Read-only views of the lake's Delta tables (no Spark). The lake root comes "
                                   "from --lake, from --pipeline's spec file or from $SPARK_JOBS_LAKE. Every view "
                                   "works from the lake alone: the spec of a pipeline is the one its lake records.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--lake", help="lake root (default: the spec file's, or $SPARK_JOBS_LAKE)")
    common.add_argument("--pipeline", help=PIPELINE_HELP)
    common.add_argument("--json", action="store_true", help="JSON output for scripts")
    views = p.add_subparsers(dest="view", required=True, metavar="VIEW")

    def view(name: str, summary: str, **kwargs: Any) -> argparse.ArgumentParser:  # in the order --help lists them
        return views.add_parser(name, parents=[common], help=summary, **kwargs)

    t = view("tables", "each pipeline's tables: version, rows, files, size")
    t.add_argument("pipeline_name", nargs="?", metavar="PIPELINE", help="only this pipeline's tables: " + PIPELINE_HELP)
    _add_table_views(view)
    r = view("runs", "job runs: rows in/aggregated/rejected, timings, reconciles")
    r.add_argument("pipeline_name", nargs="?", metavar="PIPELINE", help="only this pipeline's runs: " + PIPELINE_HELP)
    r.add_argument("--limit", type=int, default=50, help="the last N runs (default 50)")
    for name, summary in (("coverage", "per aggregate, the days whose partials hold it (an aggregate a spec change "
                                       "added is NULL elsewhere)"),
                          ("spec", "the spec the lake records, and its versions")):
        view(name, summary).add_argument("pipeline_name", metavar="PIPELINE", help=PIPELINE_HELP)
    return p


def _add_table_views(view: Callable[..., argparse.ArgumentParser]) -> None:
    """The views of one table: history, show, diff, schema, partitions, rollup."""
    h = view("history", "commits: time, operation, run, rows, what was consumed")
    h.add_argument("table", help=TABLE_HELP)
    h.add_argument("--limit", type=int, default=20, help="newest N commits (default 20)")
    s = view("show", "rows, at a version or time, filtered")
    s.add_argument("table", help=TABLE_HELP)
    when = s.add_mutually_exclusive_group()
    when.add_argument("--version", type=int, help="time travel: read this table version")
    when.add_argument("--as-of", help="time travel: the version current at this time (UTC), 'YYYY-MM-DD[ HH:MM:SS]'")
    s.add_argument("--where", help="filter, e.g. \"page = '/home' AND views >= 10\" (not SQL; see docs/inspecting.md)")
    s.add_argument("--columns", help="comma-separated columns to show (default: all but accumulators)")
    s.add_argument("--order-by", help="column[:asc|desc][,column...] to sort by before --limit")
    s.add_argument("--limit", type=int, default=20)
    d = view("diff", "keys added, removed and changed between two versions")
    d.add_argument("table", help=TABLE_HELP)
    d.add_argument("--from", dest="from_version", type=int, required=True, help="older version")
    d.add_argument("--to", dest="to_version", type=int, help="newer version (default: the latest)")
    d.add_argument("--keys", help="comma-separated key columns (default: from the spec or the table's layout)")
    d.add_argument("--limit", type=int, default=20, help="rows shown per section (counts are always complete)")
    for name, summary in (("schema", "columns, types and roles"),
                          ("partitions", "files, rows and bytes per partition")):
        v = view(name, summary)
        v.add_argument("table", help=TABLE_HELP)
        v.add_argument("--version", type=int)
    ru = view("rollup", "merge stored accumulators over a time range and keys",
              description="Every aggregate's value over the windows in [--from, --to), per --by keys and --grain "
                          "bucket, merged from the accumulators in aggregates (no Spark, no raw data). The spec is "
                          "the one the lake records (or --pipeline's).")
    ru.add_argument("table", help="PIPELINE.aggregates")
    ru.add_argument("--from", dest="start", required=True, help="first window start, 'YYYY-MM-DD[ HH:MM:SS]' (UTC)")
    ru.add_argument("--to", dest="end", required=True, help="end of the range (exclusive), a window boundary")
    ru.add_argument("--by", help="comma-separated group keys to keep (default: all; '' merges across every key)")
    ru.add_argument("--grain", default="all", help="bucket: all (default), or e.g. '1 hour', '1 day', '1 week'")
    ru.add_argument("--where", help="filter on group keys, e.g. \"page = '/home'\"")


@dataclass(frozen=True)
class _Pipeline:
    """A pipeline named on the command line: its spec, the lake's record of it, and where the spec came from."""

    spec: PipelineSpec
    record: RecordedSpec | None
    source: str


def _is_path(value: str) -> bool:
    return os.path.exists(value) or value.endswith((".yaml", ".yml")) or os.sep in value


def _pipeline(value: str, lake: str | None) -> _Pipeline:
    """A spec file (a path: it exists, ends in .yaml/.yml or has a '/'), else a pipeline name (its lake's spec)."""
    from spark_jobs.inspection.views import default_lake
    from spark_jobs.lake.spec_record import current
    from spark_jobs.spec import load_spec

    if _is_path(value):
        if not os.path.isfile(value):
            raise InspectError(f"bad pipeline name {value[:200]!r}: it is not a pipeline name (lower-case letters, digits "
                               "and '_', e.g. page_views) and no spec file is there; give an existing spec file "
                               "(e.g. pipelines/page_views.yaml) or a pipeline name")
        spec = load_spec(value, lake=lake)
        return _Pipeline(spec, current(spec.lake, spec.name), f"from the spec file {value}")
    if not _NAME.fullmatch(value):
        raise InspectError(f"{value[:200]!r} is neither a spec file nor a pipeline name; give the path of a spec "
                           "(e.g. pipelines/page_views.yaml) or a pipeline name (e.g. page_views) with --lake")
    if (root := lake or default_lake()) is None:
        raise LakeError(f"pipeline name {value!r} needs the lake that records it: pass --lake DIR or set "
                        "$SPARK_JOBS_LAKE, or give the spec file instead")
    return _recorded(root, value)


def _recorded(lake: str, name: str) -> _Pipeline:
    """The spec the lake records for pipeline ``name`` (InspectError when it records none)."""
    from spark_jobs.inspection.specs import lake_spec

    spec, record = lake_spec(lake, name)
    return _Pipeline(spec, record, f"as the lake {lake} records it (spec version {record.version})")


def _limit(n: int) -> int:
    if n < 1:
        raise InspectError(f"--limit must be at least 1, got {n}")
    return n


def _rollup(args: argparse.Namespace, named: _Pipeline | None, ref: Any) -> Any:
    from spark_jobs.inspection import views
    from spark_jobs.inspection.rollup import SOURCE, Rollup, parse_by, parse_grain, rollup

    if named is None:
        raise InspectError(f"rollup needs the pipeline's spec, and the lake records none for {ref.name}: pass "
                           "--pipeline SPEC (the spec says which aggregate each accumulator column holds)")
    spec = named.spec
    if ref.name != f"{spec.name}.aggregates" and ref.table != "aggregates":
        raise InspectError(f"rollup reads {spec.name}.aggregates, not {ref.name}")
    request = Rollup(views.parse_time(args.start), views.parse_time(args.end), parse_by(args.by, spec),
                     parse_grain(args.grain), args.where)
    result = rollup(views.open_version(ref), spec, request, record=named.record)
    if not args.json:
        print(f"merged from {spec.name}.{result.schema.metadata[SOURCE].decode()}", file=sys.stderr)
    return result


def _named(args: argparse.Namespace) -> _Pipeline | None:
    """The pipeline given as --pipeline, or as the view's PIPELINE argument (a name or a spec file)."""
    value = args.pipeline or getattr(args, "pipeline_name", None)
    value = value.removesuffix(".runs") if value and args.view == "runs" else value
    if not value:
        return None
    if args.view in ("tables", "runs") and not args.pipeline and not _is_path(value):
        return None  # a name only filters the listing: no spec needed
    named = _pipeline(value, args.lake)
    if not args.json:
        print(f"inspect: pipeline {named.spec.name} {named.source}", file=sys.stderr)
    return named


def run_inspect(args: argparse.Namespace) -> int:
    from spark_jobs.inspection import views
    from spark_jobs.inspection.render import to_json, to_text

    named = _named(args)
    lake = str(args.lake) if args.lake else named.spec.lake if named is not None else views.default_lake()
    result: Any
    if args.view in ("tables", "runs"):
        name = named.spec.name if named is not None else args.pipeline_name
        name = name.removesuffix(".runs") if name and args.view == "runs" else name
        if lake is None:
            raise LakeError(f"inspect {args.view} needs the lake: pass --lake DIR or --pipeline SPEC, or set "
                            "$SPARK_JOBS_LAKE")
        result = (views.list_tables(lake, pipeline=name) if args.view == "tables"
                  else views.runs(lake, pipeline=name, limit=_limit(args.limit)))
    elif args.view in ("coverage", "spec"):
        assert named is not None
        if named.record is None:
            raise InspectError(f"the lake {named.spec.lake}/{named.spec.name} records no spec yet; the first job, or "
                               f"`python -m spark_jobs apply --pipeline {named.spec.origin}`, records it")
        result = (views.coverage(named.spec, named.record) if args.view == "coverage"
                  else views.spec_versions(named.spec.lake, named.spec.name))
    else:
        result = _table_view(args, named, lake)
    print(to_json(result) if args.json else to_text(result))
    return 0


def _table_view(args: argparse.Namespace, named: _Pipeline | None, lake: str | None) -> Any:
    """The views of one table: history, show, diff, rollup, schema, partitions."""
    from spark_jobs.inspection import views

    ref = views.resolve_table(args.table, lake)
    if named is None and ref.pipeline is not None and lake is not None:  # the spec the lake records for the table
        with contextlib.suppress(InspectError, LakeError):
            named = _recorded(lake, ref.pipeline)
    spec = named.spec if named is not None else None
    if args.view == "history":
        return views.history(ref, limit=_limit(args.limit))
    if args.view == "show":
        return views.show(ref, version=args.version, as_of=args.as_of, where=args.where,
                          columns=views.column_list(args.columns, "--columns"), limit=_limit(args.limit),
                          order_by=views.sort_keys(args.order_by))
    if args.view == "diff":
        return views.diff(ref, from_version=args.from_version, to_version=args.to_version,
                          keys=views.column_list(args.keys, "--keys"), spec=spec, limit=_limit(args.limit))
    if args.view == "rollup":
        return _rollup(args, named, ref)
    if args.view == "schema":
        return views.schema(ref, version=args.version, spec=spec)
    return views.partitions(ref, version=args.version)
