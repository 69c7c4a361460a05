"""``python -m benchmarks rollup``: a rollup from stored accumulators against recomputing it from raw rows.

The sample pipeline (200 pages, hourly windows, eight aggregates including sketches and a
user-defined one) over N days, loaded once by combine and reduce, with its declared daily rollup
table. Then, per grain (``all`` and ``1 day``), all pages: the rollup (delta-rs and Arrow, no
Spark; best of three) read from the declared ``rollup_daily`` table and straight from the hourly
``aggregates``, each against Spark's one-shot aggregation of the same range from the raw rows,
collected to the driver, in the same process.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.batch_bench import SAMPLE, fresh, one_shot
from spark_jobs.inspection.rollup import Rollup, rollup
from spark_jobs.jobs import combine, reduce, rollups
from spark_jobs.jobs.generate import GenerateConfig, generate
from spark_jobs.lake import PipelineTables, open_lake
from spark_jobs.lake.reader import open_table
from spark_jobs.lake.spec_record import current
from spark_jobs.phases.compiled import CompiledAggregates
from spark_jobs.spark_session import SessionConfig, build_session
from spark_jobs.spec import load_spec
from spark_jobs.windows import Unwindowed

__all__ = ["rollup_bench"]


def _best(fn: Any, times: int = 3) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(times):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def rollup_bench(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    work = Path(args.work_dir)
    config = GenerateConfig(out=str(work / "landing-rollup"), days=args.days, rows_per_day=args.events // args.days,
                            seed=7, files_per_day=2)
    spark = build_session(SessionConfig(master=args.master or "local[*]", shuffle_partitions=args.shuffle_partitions,
                                        app_name="bench-rollup"))
    spec = load_spec(SAMPLE, lake=str(work / "lake-rollup"), source_path=config.out)
    marker = work / "lake-rollup.json"
    wanted = json.dumps({**dataclasses.asdict(config), "layout": 2}, sort_keys=True)  # 2: lakes record their spec
    if not marker.exists() or marker.read_text() != wanted:
        print(f"generating and loading {config.rows_per_day * config.days:,} events over {config.days} days ...",
              flush=True)
        generate(config)
        fresh(Path(spec.lake))
        for day in config.dates:
            combine.run(spark, spec, day)
        reduce.run(spark, spec)
        marker.write_text(wanted)
    record = current(spec.lake, spec.name)
    refresh_s, _ = _best(lambda: rollups.refresh(open_lake(spark), CompiledAggregates(spec, record), run_id="bench"),
                         times=1)  # built once
    table = open_table(PipelineTables(spec.lake, spec.name).aggregates)
    start = dt.datetime.fromisoformat(config.dates[0]).replace(tzinfo=dt.UTC)
    end = start + dt.timedelta(days=config.days)
    raw = spark.read.parquet(*(spec.source.partition_path(d) for d in config.dates))
    figures: dict[str, Any] = {"events": config.rows_per_day * config.days, "days": config.days,
                               "aggregates_rows": table.read(["n_rows"]).num_rows, "rollup_refresh_s": refresh_s}
    for label, grain in (("all", None), ("1 day", 86_400)):
        request = Rollup(start, end, tuple(spec.group_by), grain)
        day_col = F.date_trunc("day", F.col(spec.source.event_time)).alias("day")
        keyed = dataclasses.replace(spec, window=Unwindowed(),
                                    group_by=(*spec.group_by, "day") if grain else tuple(spec.group_by))
        recompute_s, _ = _best(lambda k=keyed, d=day_col: one_shot(raw.select("*", d), k).toArrow(), times=1)
        figures[f"grain {label}"] = {"recompute_s": recompute_s}
        for source, declared in (("rollup_daily", True), ("aggregates", False)):
            rolled_s, rows = _best(lambda r=request, d=declared: rollup(table, spec, r, declared=d))
            assert rows.schema.metadata[b"source"].decode() == source, rows.schema.metadata
            figures[f"grain {label}"][source] = {"rollup_s": rolled_s, "rows": rows.num_rows,
                                                 "speedup": recompute_s / rolled_s}
            print(f"  grain {label:6s} from {source:12s}: rollup {rolled_s:6.2f} s ({rows.num_rows:,} rows) vs Spark "
                  f"recompute from raw {recompute_s:6.2f} s: {recompute_s / rolled_s:6.1f}x faster  "
                  "[target <= 1 s, >= 50x]", flush=True)
    (work / "bench-rollup.json").write_text(json.dumps(figures, indent=2))
    print(f"\nfigures written to {work / 'bench-rollup.json'}")
    return 0
