"""Flink SQL's windowed aggregation over CSV files, timed: run by :mod:`benchmarks.flink_peer` with the
Python of a separate virtual environment holding ``apache-flink`` (its pins conflict with ours). It imports
nothing of this repository.

Streaming mode with an event-time watermark, mini-batch and local-global (two-phase) aggregation enabled, written
to CSV files. ``--query tumble`` (the default): a tumbling window TVF per page, as ``benchmarks stream`` computes.
``--query session``: a session window TVF per user with ``--gap-minutes``, as ``benchmarks sessions`` computes.
Either way the events counted (``views``) are the result's fourth column. ``--runs 2`` runs the job again in the
same JVM (warm, as a long-running cluster is), each run into its own sink directory. Prints one JSON line: each
run's wall time (submit to finish) and the command's (JVM start included).
"""

from __future__ import annotations

import argparse
import json
import time

VIEWS_COLUMN = 3  # both queries: key, window_start, window_end, views, ...


def tumble_sql(window_minutes: int) -> tuple[str, str]:
    """The sink's columns and the query: per page, tumbling windows. COUNT DISTINCT stands in for our sketch; the
    percentile is left out (``benchmarks stream``'s published figure is without it)."""
    columns = ("page STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), `views` BIGINT, total_ms BIGINT, "
               "max_ms BIGINT, avg_ms BIGINT, users BIGINT")
    query = f"""
        SELECT page, window_start, window_end, COUNT(*), SUM(duration_ms), MAX(duration_ms), AVG(duration_ms),
               COUNT(DISTINCT user_id)
        FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(event_time), INTERVAL '{window_minutes}' MINUTE))
        GROUP BY page, window_start, window_end"""
    return columns, query


def session_sql(gap_minutes: int, *, percentile: bool = True) -> tuple[str, str]:
    """The sink's columns and the query: per user, session windows of the gap, with the sample spec's built-in
    aggregates that Flink 2.3 has a built-in for (``benchmarks sessions`` drops the user-defined weighted_ms):

    - views, total_ms, max_ms, avg_ms: COUNT(*), SUM, MAX, AVG, as ours;
    - users (our approx_count_distinct, an HLL sketch): Flink has no approximate distinct count, so its exact
      COUNT(DISTINCT user_id), a distinct-value map per session (1 for every session, keyed by user, in both);
    - p95_ms (our approx_percentile, a sketch): Flink has no approximate percentile; its exact PERCENTILE keeps
      every value of the session (more state than our sketch): ``percentile=False`` leaves it out;
    - first_user (our ``first``: the user_id at the earliest event time): no built-in; FIRST_VALUE is the first
      row to arrive, not the earliest, and its planner folds FIRST_VALUE of the key into the key, so it is left out.

    Rows without a user are rejected, as the spec's ``null_keys: reject`` does (a NULL string is an empty CSV
    field). Flink plans a session window aggregate in one phase whatever ``agg-phase-strategy`` says: sessions
    are unaligned windows, which its local-global (two-phase) window aggregation does not cover (its plan shows one
    WindowAggregate, no LocalWindowAggregate), so TWO_PHASE is set and silently not applied; mini-batch applies.
    """
    columns = ("user_id STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), `views` BIGINT, "
               "total_ms BIGINT, max_ms BIGINT, avg_ms BIGINT, users BIGINT" + (", p95_ms DOUBLE" if percentile else ""))
    query = f"""
        SELECT user_id, window_start, window_end, COUNT(*), SUM(duration_ms), MAX(duration_ms), AVG(duration_ms),
               COUNT(DISTINCT user_id){", PERCENTILE(duration_ms, 0.95)" if percentile else ""}
        FROM TABLE(SESSION(TABLE events PARTITION BY user_id, DESCRIPTOR(event_time),
                           INTERVAL '{gap_minutes}' MINUTE))
        WHERE user_id <> ''
        GROUP BY user_id, window_start, window_end"""
    return columns, query


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True, help="directory of headerless CSV files")
    parser.add_argument("--sink", required=True, help="directory the results go to")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--watermark-minutes", type=int, default=10)
    parser.add_argument("--query", choices=["tumble", "session"], default="tumble",
                        help="tumble: per page, tumbling windows; session: per user, session windows")
    parser.add_argument("--window-minutes", type=int, default=60, help="tumble: the window's size")
    parser.add_argument("--gap-minutes", type=int, default=30, help="session: the gap")
    parser.add_argument("--no-percentile", action="store_true", help="session: leave PERCENTILE out")
    parser.add_argument("--runs", type=int, default=1, help="runs of the job in this JVM, each into --sink/run-N")
    return parser


def main() -> None:
    started = time.perf_counter()
    args = _parser().parse_args()

    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    for key, value in {"parallelism.default": str(args.parallelism),
                       "table.exec.mini-batch.enabled": "true", "table.exec.mini-batch.allow-latency": "1 s",
                       "table.exec.mini-batch.size": "5000", "table.optimizer.agg-phase-strategy": "TWO_PHASE"}.items():
        config.set(key, value)
    days, minutes = divmod(args.watermark_minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)  # each field within its interval type's default precision
    env.execute_sql(f"""
        CREATE TABLE events (event_time TIMESTAMP(3), user_id STRING, page STRING, duration_ms BIGINT,
                             WATERMARK FOR event_time AS event_time - INTERVAL '{days}' DAY
                                                         - INTERVAL '{hours}' HOUR - INTERVAL '{minutes}' MINUTE)
        WITH ('connector' = 'filesystem', 'path' = '{args.source}', 'format' = 'csv',
              'csv.ignore-parse-errors' = 'true')""")  # an empty duration_ms is NULL
    columns, query = (tumble_sql(args.window_minutes) if args.query == "tumble"
                      else session_sql(args.gap_minutes, percentile=not args.no_percentile))
    runs = []
    for run in range(1, args.runs + 1):
        env.execute_sql(f"""
            CREATE TABLE results_{run} ({columns})
            WITH ('connector' = 'filesystem', 'path' = '{args.sink}/run-{run}', 'format' = 'csv')""")
        submitted = time.perf_counter()
        env.execute_sql(f"INSERT INTO results_{run} {query}").wait()
        runs.append(time.perf_counter() - submitted)
    done = time.perf_counter()
    print(json.dumps({"job_s": runs, "command_s": done - started}))


if __name__ == "__main__":
    main()
