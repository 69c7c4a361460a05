"""``python -m benchmarks <suite>``: benchmarks (not tests), ratios against baselines run in the same process.

Run from the repository root. Exit codes as ``python -m spark_jobs``: 0 ok, 2 bad arguments, 3 bad input,
6 Spark or Airflow cannot be reached or run, 1 anything unexpected.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

WORK_DIR = "/tmp/spark_jobs_bench"


def cmd_batch(args: argparse.Namespace) -> int:
    from benchmarks.batch_bench import batch

    return batch(args)


def cmd_stream(args: argparse.Namespace) -> int:
    from benchmarks.stream_bench import stream

    return stream(args)


def cmd_scale(args: argparse.Namespace) -> int:
    from benchmarks.scale_bench import scale

    return scale(args)


def cmd_rollup(args: argparse.Namespace) -> int:
    from benchmarks.rollup_bench import rollup_bench

    return rollup_bench(args)


def cmd_evolution(args: argparse.Namespace) -> int:
    from benchmarks.evolution_bench import evolution_bench

    return evolution_bench(args)


def cmd_sessions(args: argparse.Namespace) -> int:
    from benchmarks.sessions_bench import sessions_bench

    return sessions_bench(args)


def cmd_airflow(args: argparse.Namespace) -> int:
    from benchmarks.airflow_bench import airflow_bench

    return airflow_bench(args)


def _seconds(text: str) -> list[int]:
    """Whole seconds, comma-separated, each at least 1."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"bad value {text!r}: give whole seconds >= 1, comma-separated (e.g. 1,2)")
    return values


def _peers(text: str) -> tuple[str, ...]:
    """``benchmarks sessions --peer``: spark and/or flink, comma-separated, or none."""
    values = tuple(dict.fromkeys(x.strip() for x in text.split(",")))
    if values == ("none",):
        return ()
    if not values or not set(values) <= {"spark", "flink"}:
        raise argparse.ArgumentTypeError(f"bad value {text!r}: give spark and/or flink, comma-separated (e.g. "
                                         f"spark,flink), or none")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="Benchmarks of the spark_jobs pipelines "
                                     "(not tests): ratios against baselines run in the same process.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log each step")
    sub = parser.add_subparsers(dest="suite", required=True, metavar="SUITE")

    def common(p: argparse.ArgumentParser, days: int) -> None:
        p.add_argument("--days", type=int, default=days, help=f"days of events (default {days})")
        p.add_argument("--work-dir", default=WORK_DIR, help=f"where data, lakes and logs go (default {WORK_DIR})")

    def spark(p: argparse.ArgumentParser, shuffle_partitions: int | str, events: bool = True) -> None:
        if events:
            p.add_argument("--events", type=int, default=10_000_000, help="events generated (default 10M)")
        p.add_argument("--master", help="Spark master URL (default local[*])")
        p.add_argument("--shuffle-partitions", type=int,
                       help=f"spark.sql.shuffle.partitions (default {shuffle_partitions})")

    b = sub.add_parser("batch", help="combine+reduce vs Spark's one-shot aggregation",
                       description="The batch path (combine, reduce, backfill, full re-merge, a user-defined "
                                   "aggregate, driver memory) against Spark's one-shot groupBy().agg() to Delta.")
    common(b, 30)
    spark(b, 8)
    b.set_defaults(func=cmd_batch)

    c = sub.add_parser("scale", help="cost as the data grows: time per event and driver memory at several sizes",
                       description="The batch path at several sizes over the same days (a day grows with the lake): "
                                   "time per event and driver memory, largest size against smallest.")
    common(c, 30)
    spark(c, "two per core, at least 8", events=False)
    c.add_argument("--sizes", default="10000000,40000000", help="event counts, comma-separated (default 10M,40M)")
    c.set_defaults(func=cmd_scale)

    r = sub.add_parser("rollup", help="a rollup from stored accumulators vs recomputing it from raw rows",
                       description="inspect rollup over every page and all days (grain all, then 1 day) against "
                                   "Spark's one-shot aggregation of the same range from the raw rows.")
    common(r, 30)
    spark(r, "two per core, at least 8")
    r.set_defaults(func=cmd_rollup)

    e = sub.add_parser("evolution", help="apply of a spec change vs recomputing the tables from raw rows",
                       description="apply of a window coarsening, a key drop (both re-derived from the stored "
                                   "accumulators, in Arrow and in Spark) and an added aggregate, against Spark "
                                   "recomputing the same tables from the raw rows.")
    common(e, 30)
    spark(e, "two per core, at least 8")
    e.set_defaults(func=cmd_evolution)

    n = sub.add_parser("sessions", help="session windows per user vs Spark's session_window, batch and stream",
                       description="combine + reduce of a fresh day and the daily reduce of session windows (gap 30 "
                                   "minutes, keyed by user) against Spark's one-shot groupBy(session_window(...)); "
                                   "the stream against Structured Streaming's session_window and, with --peer "
                                   "flink, Flink's SESSION window TVF on the same files.")
    common(n, 30)
    spark(n, 8)
    n.add_argument("--parts", default="batch,stream", choices=["batch", "stream", "batch,stream"],
                   help="batch, stream or both (default batch,stream)")
    n.add_argument("--files", type=int, default=100, help="stream: landing files the events are split into "
                                                          "(default 100)")
    n.add_argument("--batch-files", default="20", help="stream: mini-batch sizes in files (default 20)")
    n.add_argument("--peer", type=_peers, default="spark",
                   help="stream: peers over the same files, comma-separated: spark (Structured Streaming's "
                        "session_window) and/or flink (Flink 2.3's SESSION window TVF; installs apache-flink into its "
                        "own venv under --work-dir), or none for ours alone (default spark)")
    n.set_defaults(func=cmd_sessions)

    s = sub.add_parser("stream", help="mini-batches vs Spark's windowed streaming aggregation",
                       description="Stream throughput for a few mini-batch sizes against Spark's own windowed "
                                   "streaming aggregation, then end-to-end latency with files landing live.")
    common(s, 30)
    spark(s, 4)
    s.add_argument("--files", type=int, help="landing files the events are split into (default 100)")
    s.add_argument("--batch-files", help="mini-batch sizes in files, comma-separated (default 5,20,50; 0 for the "
                                         "latency run only)")
    s.add_argument("--trigger", type=_seconds, default="1,2", help="latency runs: trigger intervals in whole "
                                                                   "seconds, comma-separated (default 1,2)")
    s.add_argument("--latency-files", type=int, default=40, help="latency run: files landed (default 40)")
    s.add_argument("--latency-rows", type=int, default=5000, help="latency run: events per file (default 5000)")
    s.add_argument("--peer", choices=["flink"], help="also run Flink 2.3's local mini-cluster over the same events "
                                                    "(installs apache-flink into its own venv under --work-dir)")
    s.add_argument("--latency-interval", type=float, default=1.0,
                   help="latency run: seconds between files (default 1.0)")
    s.set_defaults(func=cmd_stream)

    a = sub.add_parser("airflow", help="a scheduler backfill vs the warm CLI",
                       description="A real Airflow scheduler's backfill of N days against the same days through "
                                   "the warm CLI, both on one Spark Connect server.")
    common(a, 10)
    a.add_argument("--rows-per-day", type=int, default=100_000, help="events a day (default 100k)")
    a.add_argument("--max-active-runs", type=int, default=3, help="backfill runs at once (default 3)")
    a.add_argument("--parallelism", type=int, default=6, help="AIRFLOW__CORE__PARALLELISM (default 6)")
    a.add_argument("--timeout", type=float, default=3600, help="seconds the backfill may take (default 3600)")
    a.add_argument("--driver-memory", default="2g", help="the Connect server's driver memory (default 2g)")
    a.set_defaults(func=cmd_airflow)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from spark_jobs.cli import run_parsed

    return run_parsed(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
