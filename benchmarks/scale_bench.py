"""``python -m benchmarks scale``: cost as the data grows, at several sizes in one process.

For each size (default 10M and 40M events over the same 30 days, so a day grows with the lake), on
a fresh lake: combine every day, the first reduce, then one more day (combine + the daily reduce),
and Spark's one-shot ``groupBy().agg()`` of that day as the same-process reference. Figures are
time per event (or per partial row for the reduces) and the driver's peak memory growth, each
as a ratio of the largest size to the smallest: flat is 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.batch_bench import SAMPLE, PeakRss, fresh, landing, one_shot
from spark_jobs.errors import UsageError
from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables, open_lake
from spark_jobs.spark_session import SessionConfig, build_session
from spark_jobs.spec import load_spec

__all__ = ["scale"]


def _sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(float(x)) for x in text.split(",") if x.strip()})
    except ValueError:
        sizes = []
    if len(sizes) < 2 or sizes[0] < 1:
        raise UsageError(f"bad --sizes {text!r}; give two or more event counts, e.g. 10000000,40000000")
    return sizes


def scale(args: argparse.Namespace) -> int:
    sizes = _sizes(args.sizes)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    spark = build_session(SessionConfig(master=args.master or "local[*]", shuffle_partitions=args.shuffle_partitions,
                                        app_name="bench-scale"))
    lake = open_lake(spark)
    runs: dict[int, dict[str, Any]] = {}
    for i, events in enumerate(sizes):
        config = landing(work, args.days, events, f"landing-{events}", max(2, events // args.days // 500_000))
        dates = config.dates
        spec = load_spec(SAMPLE, lake=str(fresh(work / "lake-scale")), source_path=config.out)
        if i == 0:  # warm the JVM, the Python workers and the code paths, outside any figure
            warm = dataclasses.replace(spec, lake=str(fresh(work / "lake-scale-warm")))
            combine.run(spark, warm, dates[0])
            reduce.run(spark, warm)
        print(f"{events:,} events: combining {len(dates) - 1} days, then the first reduce ...", flush=True)
        f: dict[str, Any] = {"events": config.rows_per_day * config.days, "events_per_day": config.rows_per_day}
        with PeakRss() as mem_combine:
            start = time.perf_counter()
            for day in dates[:-1]:
                combine.run(spark, spec, day)
            f["combine_s"] = time.perf_counter() - start
        with PeakRss() as mem_reduce:
            start = time.perf_counter()
            reduce.run(spark, spec)
            f["first_reduce_s"] = time.perf_counter() - start
        partials = sum(x.num_records or 0 for x in lake.files(PipelineTables(spec.lake, spec.name).partials))
        print(f"{events:,} events: one more day, and the one-shot reference ...", flush=True)
        start = time.perf_counter()
        combine.run(spark, spec, dates[-1])
        f["day_combine_s"] = time.perf_counter() - start
        start = time.perf_counter()
        reduce.run(spark, spec)
        f["daily_reduce_s"] = time.perf_counter() - start
        start = time.perf_counter()
        raw = spark.read.parquet(spec.source.partition_path(dates[-1]))
        lake.append(one_shot(raw, spec), str(fresh(work / "baseline-scale")))
        f["one_shot_day_s"] = time.perf_counter() - start
        combined = config.rows_per_day * (len(dates) - 1)
        f.update({
            "partial_rows": partials,
            "combine_us_per_event": 1e6 * f["combine_s"] / combined,
            "first_reduce_us_per_partial_row": 1e6 * f["first_reduce_s"] / max(partials, 1),
            "day_us_per_event": 1e6 * (f["day_combine_s"] + f["daily_reduce_s"]) / config.rows_per_day,
            "one_shot_us_per_event": 1e6 * f["one_shot_day_s"] / config.rows_per_day,
            "driver_rss_growth_mb_combine": mem_combine.growth_mb,
            "driver_rss_growth_mb_reduce": mem_reduce.growth_mb,
        })
        f["day_vs_one_shot"] = f["day_us_per_event"] / f["one_shot_us_per_event"]
        runs[events] = f
    small, large = runs[sizes[0]], runs[sizes[-1]]
    ratios = {
        "combine, time per event [flat = 1]": large["combine_us_per_event"] / small["combine_us_per_event"],
        "first reduce, time per partial row [flat = 1]":
            large["first_reduce_us_per_partial_row"] / small["first_reduce_us_per_partial_row"],
        "one more day (combine + daily reduce), time per event [flat = 1]":
            large["day_us_per_event"] / small["day_us_per_event"],
        "one-shot groupBy of a day (reference), time per event":
            large["one_shot_us_per_event"] / small["one_shot_us_per_event"],
        "driver memory growth while combining [flat = 1]":
            max(large["driver_rss_growth_mb_combine"], 1.0) / max(small["driver_rss_growth_mb_combine"], 1.0),
        "driver memory growth in the first reduce [flat = 1]":
            max(large["driver_rss_growth_mb_reduce"], 1.0) / max(small["driver_rss_growth_mb_reduce"], 1.0),
    }
    print()
    for events, f in runs.items():
        print(f"  {events:,} events ({f['events_per_day']:,} a day, {f['partial_rows']:,} partial rows)")
        for key, value in f.items():
            if key not in ("events", "events_per_day", "partial_rows"):
                print(f"    {key:34s} {value:,.2f}")
    print(f"\n  {sizes[-1]:,} vs {sizes[0]:,} events:")
    for key, value in ratios.items():
        print(f"  {value:7.2f}x  {key}")
    out = {"cores": os.cpu_count(), "sizes": {str(k): v for k, v in runs.items()}, "ratios": ratios}
    (work / "bench-scale.json").write_text(json.dumps(out, indent=2))
    print(f"\nfigures written to {work / 'bench-scale.json'}")
    return 0
