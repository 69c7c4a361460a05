"""The job commands: parse arguments, call one function, map errors to exit codes.

``python -m spark_jobs`` (:mod:`spark_jobs.__main__`) is these plus ``server``; the warm job runner of
:mod:`spark_jobs.server` runs these. The exit codes are :data:`EXIT_CODES` (``--help`` ends with them).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from spark_jobs import __version__
from spark_jobs.errors import InputError, PipelineError, UsageError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_jobs.spark_session import SessionConfig
    from spark_jobs.spec import PipelineSpec

log = logging.getLogger("spark_jobs")


def _spec(args: argparse.Namespace, *, applied: bool = False) -> PipelineSpec:
    """The spec of ``--pipeline``; ``applied``: refused (exit 2) before Spark starts unless it is the lake's."""
    from spark_jobs.spec import load_spec

    spec = load_spec(args.pipeline, lake=args.lake, source_path=getattr(args, "source_path", None))
    if applied:
        from spark_jobs.lake.spec_record import applied_record

        _session_config(args, "check")  # a bad option is refused before the lake is touched
        applied_record(spec, run_id=args.run_id or "")
    return spec


def _session_config(args: argparse.Namespace, app: str, *, connect: bool = True) -> SessionConfig:
    from spark_jobs.spark_session import SessionConfig

    options = ("master", "remote", "shuffle_partitions", "executor_cores", "executor_memory")
    given: dict[str, Any] = {k: v for k in options if (v := getattr(args, k)) not in (None, "")}  # else $SPARK_*
    if args.master or not connect:
        given["remote"] = None
    return SessionConfig(app_name=f"spark_jobs {app}", progress=sys.stderr.isatty(),  # a bad option: UsageError, 2
                         extra=parse_confs(getattr(args, "conf", [])), **given)


def parse_confs(confs: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``--conf spark.key=value`` options as pairs (exit 2 on anything else)."""
    if bad := [c for c in confs if "=" not in c or not c.split("=", 1)[0].startswith("spark.")]:
        raise UsageError(f"bad --conf {bad[0]!r}; use --conf spark.some.key=value")
    return tuple((k, v) for k, v in (c.split("=", 1) for c in confs))


def _session(args: argparse.Namespace, app: str, *, connect: bool = True) -> SparkSession:
    """The job's session: a Spark Connect client when ``--remote``/``$SPARK_REMOTE`` names a server
    (and the job can run as one), else its own application; an explicit ``--master`` wins."""
    from spark_jobs.spark_session import build_session

    config = _session_config(args, app, connect=connect)
    spark = build_session(config)
    if config.ui and not config.remote:
        print(f"Spark UI of this job: {spark.sparkContext.uiWebUrl}", file=sys.stderr, flush=True)
    return spark


def _dates(first: str, last: str | None) -> list[str]:
    from spark_jobs.jobs.combine import parse_date

    start, end = dt.date.fromisoformat(parse_date(first)), dt.date.fromisoformat(parse_date(last or first))
    if end < start:
        raise InputError(f"--to {end} is before --date/--from {start}; swap them")
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]


def cmd_generate(args: argparse.Namespace) -> None:
    from spark_jobs.jobs.generate import GenerateConfig, generate

    try:
        config = GenerateConfig(out=args.out, days=args.days, rows_per_day=args.rows_per_day, seed=args.seed,
                                format=args.format, start=args.start, files_per_day=args.files_per_day)
    except ValueError as exc:  # bad --days, --format, ...: the message names the option
        raise UsageError(str(exc)) from exc
    result = generate(config, progress=not args.quiet)
    print(f"wrote {result.rows:,} events ({result.bad_rows:,} bad on purpose) in {result.files} {args.format} "
          f"files, {result.dates[0]}..{result.dates[-1]}, under {args.out}")


def _combine(args: argparse.Namespace, app: str) -> tuple[SparkSession, PipelineSpec]:
    """Combine each day of ``--date``..``--to``; the session and spec, for what follows."""
    from spark_jobs.jobs import combine

    dates = _dates(args.date, args.to)
    spec = _spec(args, applied=True)
    spark = _session(args, app)
    for date in dates:  # one run id per day: a given --run-id gets the date as suffix over a range
        run_id = f"{args.run_id}-{date}" if args.run_id and len(dates) > 1 else args.run_id
        print(combine.run(spark, spec, date, run_id=run_id).summary())
    return spark, spec


def cmd_combine(args: argparse.Namespace) -> None:
    _combine(args, "combine")


def cmd_reduce(args: argparse.Namespace) -> None:
    from spark_jobs.jobs import reduce

    spec = _spec(args, applied=True)
    spark = _session(args, "reduce")
    print(reduce.run(spark, spec, run_id=args.run_id, full=args.full).summary())


def cmd_run(args: argparse.Namespace) -> None:
    """Combine each day of a range, then reduce once: a backfill without Airflow."""
    from spark_jobs.jobs import reduce

    spark, spec = _combine(args, "run")  # --run-id R: combines R-<date> (R for one day), the reduce R-reduce
    print(reduce.run(spark, spec, run_id=args.run_id and f"{args.run_id}-reduce").summary())


def cmd_validate(args: argparse.Namespace) -> None:
    """Run a Great Expectations gate; exit 5 (QualityError) when it fails, after writing its report."""
    from spark_jobs.quality.gate import validate

    if args.date is not None:
        _dates(args.date, None)  # a bad --date is refused before the lake is touched
    spec = _spec(args, applied=True)
    spark = _session(args, f"validate {args.suite}")
    print(validate(spark, spec, args.suite, date=args.date, reports=args.reports, run_id=args.run_id).text())


def cmd_maintain(args: argparse.Namespace) -> None:
    from spark_jobs.lake.maintenance import maintain

    spec = _spec(args)
    for entry in maintain(spec.lake, spec.name, retention_hours=args.retention_hours, dry_run=args.dry_run,
                          enforce_retention=not args.allow_short_retention):
        print(("(dry run) " if args.dry_run else "") + entry.summary())


def cmd_stream(args: argparse.Namespace) -> None:
    from spark_jobs.stream import query as stream

    spec = _spec(args, applied=True)
    # its own application: foreachBatch and the driver merge's held state need a driver in this process
    spark = _session(args, "stream", connect=False)
    print(stream.run(spark, spec, available_now=args.available_now, run_id=args.run_id).summary())


def cmd_explain(args: argparse.Namespace) -> None:
    from spark_jobs.phases import CompiledAggregates
    from spark_jobs.phases.explain import PHASES, explain, phase_frame

    compiled = CompiledAggregates(_spec(args))
    spark = _session(args, "explain")
    for phase in PHASES if args.phase is None else (args.phase,):
        print(explain(spark, compiled, phase))
        print(f"\n  == Spark's physical plan of {phase} ==", flush=True)
        phase_frame(spark, compiled, phase).explain(mode=args.mode)


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from spark_jobs.lake.spec_record import read_records
    from spark_jobs.spec_plan import make_plan

    spec = _spec(args)
    plan = make_plan(spec, read_records(spec.lake, spec.name))
    print(json.dumps(plan.to_json(), indent=2, default=str) if args.json else plan.text())
    return 2 if plan.diff.refused else 0


def cmd_apply(args: argparse.Namespace) -> None:
    from spark_jobs.jobs.apply import apply

    spec = _spec(args)
    result = apply(spec, spark=lambda: _session(args, "apply", connect=False), engine=args.engine, run_id=args.run_id)
    print(result.plan.text(), result.summary(), sep="\n")


Command = Callable[[Any], None]  # adds a subcommand to the parser's subparsers


def build_parser(commands: Sequence[Command] = ()) -> argparse.ArgumentParser:
    """The job commands' parser, then ``commands`` (``python -m spark_jobs`` adds ``server``)."""
    parser = argparse.ArgumentParser(prog="python -m spark_jobs", description="Run and inspect an aggregation pipeline: "
                                     "combine, reduce, stream, validate, explain, plan, apply, inspect.",
                                     epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log each step")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_jobs, _add_spec_tools, *commands):  # in the order ``--help`` lists them
        add(sub)
    _verbose_after_the_command(parser)
    return parser


def _spec_command(sub: Any, name: str, func: Callable[[Any], int | None], help: str) -> argparse.ArgumentParser:
    """A command that runs a spec on Spark, with the options they all take: the spec, where and how it runs."""
    p = sub.add_parser(name, help=help)
    p.set_defaults(func=func)
    p.add_argument("--pipeline", required=True, help="pipeline spec YAML, e.g. pipelines/page_views.yaml")
    p.add_argument("--lake", help="override the spec's lake root")
    p.add_argument("--source-path", help="override the spec's source.path")
    p.add_argument("--run-id", help="run id to record (default: generated)")
    p.add_argument("--master", help="Spark master URL of an own application (default $SPARK_MASTER or local[*])")
    p.add_argument("--remote", help="Spark Connect server to run on, sc://host:port (default $SPARK_REMOTE; "
                                    "the stream always runs its own application)")
    p.add_argument("--shuffle-partitions", type=int,
                   help="spark.sql.shuffle.partitions (default: two per core of the cluster, at least 8)")
    p.add_argument("--executor-cores", type=int, help="cores per executor on a cluster (default "
                                                     "$SPARK_EXECUTOR_CORES, else the cluster manager's)")
    p.add_argument("--executor-memory", help="memory per executor on a cluster, e.g. 4g (default "
                                             "$SPARK_EXECUTOR_MEMORY, else the cluster manager's)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting of the job's own application (repeatable), e.g. "
                        "spark.archives=env.tar.gz#env; a Connect server takes its settings at `server start`")
    return p


def _add_jobs(sub: Any) -> None:
    """The jobs: sample data, the batch path (combine, reduce and run), its gates and upkeep, the stream."""
    g = sub.add_parser("generate", help="write sample events, hive-partitioned by event_date")
    g.add_argument("--out", required=True, help="landing directory, e.g. data/landing/page_views")
    g.add_argument("--days", type=int, default=3)
    g.add_argument("--rows-per-day", type=int, default=100_000)
    g.add_argument("--seed", type=int, default=7)
    g.add_argument("--format", default="parquet", help="parquet, json or csv")
    g.add_argument("--start", default="2024-03-01", help="first event_date (YYYY-MM-DD)")
    g.add_argument("--files-per-day", type=int, default=2)
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.set_defaults(func=cmd_generate)
    c = _spec_command(sub, "combine", cmd_combine, "pre-aggregate landing day(s) into partials (replaces those days)")
    c.add_argument("--date", required=True, help="event_date to combine, YYYY-MM-DD")
    c.add_argument("--to", help="last date of a range to combine (inclusive)")
    r = _spec_command(sub, "reduce", cmd_reduce, "merge new partials into the aggregates table, exactly once")
    r.add_argument("--full", action="store_true", help="re-merge every key, not only the changed ones")
    run = _spec_command(sub, "run", cmd_run, "combine a date range, then reduce (one Spark session)")
    run.add_argument("--date", "--from", dest="date", required=True, help="first date, YYYY-MM-DD")
    run.add_argument("--to", help="last date (inclusive; default: the first)")
    v = _spec_command(sub, "validate", cmd_validate, "run a Great Expectations gate (input: a landing day; "
                      "outputs: partials of a day before reduce, or the serving table)")
    v.add_argument("--suite", required=True, choices=["input", "outputs"], help="which gate")
    v.add_argument("--date", help="event_date (required for input; for outputs: that day's partials, pre-reduce)")
    v.add_argument("--reports", help="report directory (default <lake>/<pipeline>/_quality)")
    m = sub.add_parser("maintain", help="compact small files, vacuum, checkpoint (delta-rs, no Spark)")
    m.add_argument("--pipeline", required=True, help="pipeline spec YAML")
    m.add_argument("--lake", help="override the spec's lake root")
    m.add_argument("--retention-hours", type=int, default=168, help="vacuum files removed longer ago (default 168)")
    m.add_argument("--allow-short-retention", action="store_true",
                   help="allow a retention below 168 hours (only when no job or reader uses older versions)")
    m.add_argument("--dry-run", action="store_true", help="list what vacuum would delete; change nothing")
    m.set_defaults(func=cmd_maintain)
    st = _spec_command(sub, "stream", cmd_stream, "windowed mini-batch aggregation of new landing files, with a "
                       "changelog")
    st.add_argument("--available-now", action="store_true",
                    help="process every landing file present in mini-batches, then exit (default: run until "
                         "SIGTERM/SIGINT, which stops at a mini-batch boundary)")


def _add_spec_tools(sub: Any) -> None:
    """explain, plan, apply and inspect: what a spec compiles to, how the lake follows a changed one, what it holds."""
    ex = _spec_command(sub, "explain", cmd_explain, "the plan of each phase: per aggregate its stored columns and "
                       "local and global expressions, then Spark's physical plan (reads no data)")
    ex.add_argument("phase", nargs="?", choices=["combine", "reduce", "stream"], help="one phase (default: all)")
    ex.add_argument("--mode", default="simple", choices=["simple", "extended", "formatted", "cost", "codegen"],
                    help="Spark's explain mode (default simple)")
    pl = sub.add_parser("plan", help="compare a spec with the lake's: each change, its cost, the days to recombine "
                                     "(no Spark, changes nothing)")
    pl.add_argument("--pipeline", required=True, help="the new pipeline spec YAML")
    pl.add_argument("--lake", help="override the spec's lake root")
    pl.add_argument("--source-path", help="override the spec's source.path")
    pl.add_argument("--json", action="store_true", help="JSON output for scripts")
    pl.set_defaults(func=cmd_plan)
    ap = _spec_command(sub, "apply", cmd_apply, "make the lake match a changed spec: schemas, re-derivations from "
                       "the stored accumulators, the spec record (exactly once; rerun after a crash)")
    ap.add_argument("--engine", default="auto", choices=["auto", "arrow", "spark"],
                    help="where merges run: arrow on the driver, spark, or auto (spark for tables over 2M rows)")
    from spark_jobs.inspection.inspect_cli import add_inspect_parser, run_inspect

    add_inspect_parser(sub).set_defaults(func=run_inspect)


EXIT_CODES = """exit codes:
  0  done
  1  an unexpected error (a bug: please report it with the log)
  2  bad input: the spec, an option, a date, a filter, or a spec that differs from the lake's (run plan/apply)
  3  the input data: a missing landing partition, an unreadable file (source.on_bad_file: fail), bad columns
  4  the lake: no table yet, a table in another layout, a commit lost to writers that kept winning
  5  a quality gate failed (its report names the expectations)
  6  compute: Spark or the Connect server failed or could not start
  130 interrupted"""


def _verbose_after_the_command(parser: argparse.ArgumentParser) -> None:
    """``-v`` works after the command too (``python -m spark_jobs combine ... -v``), at every level."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if not any("--verbose" in a.option_strings for a in child._actions):
                    child.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                                       help="log each step")
                _verbose_after_the_command(child)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one job command (``python -m spark_jobs`` adds ``server``)."""
    return run_parsed(build_parser(), argv)


def run_parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None, *, keep_session: bool = False) -> int:
    """Parse ``argv``, run the chosen ``func`` (None is exit code 0), map a pipeline error to its exit code; then
    release a Spark Connect session unless ``keep_session`` (a warm caller running many commands keeps it)."""
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args.func(args) or 0)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if not keep_session:
            from spark_jobs.spark_session import close_remote

            close_remote()
