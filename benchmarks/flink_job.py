"""Flink SQL's windowed aggregation over CSV files, timed: run by :mod:`benchmarks.flink_peer` with the
Python of a separate virtual environment holding ``apache-flink`` (its pins conflict with ours). It imports
nothing of this repository.

Streaming mode with an event-time watermark, mini-batch and local-global (two-phase) aggregation enabled,
a tumbling window TVF per page, written to CSV files. ``--runs 2`` runs the job again in the same JVM (warm, as
a long-running cluster is), each run into its own sink directory. Prints one JSON line: each run's wall time
(submit to finish) and the command's (JVM start included).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    started = time.perf_counter()
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True, help="directory of headerless CSV files")
    parser.add_argument("--sink", required=True, help="directory the results go to")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--watermark-minutes", type=int, default=10)
    parser.add_argument("--window-minutes", type=int, default=60)
    parser.add_argument("--runs", type=int, default=1, help="runs of the job in this JVM, each into --sink/run-N")
    args = parser.parse_args()

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
    runs = []
    for run in range(1, args.runs + 1):
        env.execute_sql(f"""
            CREATE TABLE results_{run} (page STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), `views` BIGINT,
                                        total_ms BIGINT, max_ms BIGINT, avg_ms BIGINT, users BIGINT)
            WITH ('connector' = 'filesystem', 'path' = '{args.sink}/run-{run}', 'format' = 'csv')""")
        submitted = time.perf_counter()
        env.execute_sql(f"""
            INSERT INTO results_{run}
            SELECT page, window_start, window_end, COUNT(*), SUM(duration_ms), MAX(duration_ms), AVG(duration_ms),
                   COUNT(DISTINCT user_id)
            FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(event_time), INTERVAL '{args.window_minutes}' MINUTE))
            GROUP BY page, window_start, window_end""").wait()
        runs.append(time.perf_counter() - submitted)
    done = time.perf_counter()
    print(json.dumps({"job_s": runs, "command_s": done - started}))


if __name__ == "__main__":
    main()
