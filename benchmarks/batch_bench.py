"""``python -m benchmarks batch``: the batch path against Spark's one-shot ``groupBy().agg()``.

Every figure is a ratio against a baseline measured in the same process on the same files,
because these machines are noisy. The baseline is Spark's own single-phase aggregation of the
same aggregates (native ``approx_count_distinct``, ``percentile_approx``, ``min_by``...) over
the raw rows, written to Delta through the same commit path.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from spark_jobs.jobs import changelog_feed, combine, reduce
from spark_jobs.jobs.generate import GenerateConfig, generate
from spark_jobs.lake import PipelineTables, open_lake
from spark_jobs.spark_session import SessionConfig, build_session
from spark_jobs.spec import AggregateSpec, PipelineSpec, load_spec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["PeakRss", "batch", "fresh", "landing", "native_aggregate", "one_shot"]

SAMPLE = Path(__file__).resolve().parent.parent / "pipelines" / "page_views.yaml"


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class CallTimer:
    """Seconds spent in ``owner.name`` while active: the share of a job one step of it takes, the job unchanged."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name, self.seconds = owner, name, 0.0

    def __enter__(self) -> CallTimer:
        self.inner = getattr(self.owner, self.name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return self.inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        setattr(self.owner, self.name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self.owner, self.name, self.inner)


class PeakRss:
    """Peak resident memory of this (driver) process while the block runs, sampled every 20 ms."""

    def __enter__(self) -> PeakRss:
        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def one_shot(raw: DataFrame, spec: PipelineSpec) -> DataFrame:
    """Spark's single-phase aggregation of the spec's aggregates: the baseline.

    Deliberately its own mapping of ``fn`` to Spark's built-in one-shot functions, not the
    aggregate classes of ``spark_jobs.aggregates``: those compile to the two phases being measured
    (sketch accumulators, then a merge), and the user-defined examples run as Arrow UDAFs with no
    Spark expression at all. The baseline is what Spark does alone.
    """
    from pyspark.sql import functions as F


    et = F.col(spec.source.event_time)
    valid = raw.where(et.isNotNull() & F.col(spec.group_by[0]).isNotNull()) if spec.group_by else raw
    rows = spec.window.assign(valid, event_time=spec.source.event_time, keys=spec.group_by)
    return rows.groupBy(*spec.key_columns).agg(*(native_aggregate(a, et).alias(a.name) for a in spec.aggregates),
                                               F.count(F.lit(1)).alias("n_rows"))


def native_aggregate(agg: AggregateSpec, et: Column) -> Column:
    """Spark's own one-shot function for an aggregate of the spec."""
    from pyspark.sql import functions as F

    if not agg.columns:
        return F.count(F.lit(1))
    c = F.col(agg.columns[0])
    if agg.fn == "count":
        return F.count(c)
    if agg.fn in ("sum", "min", "max", "avg"):
        return getattr(F, agg.fn)(c)
    if agg.fn == "count_distinct":
        return F.count_distinct(c)
    if agg.fn == "approx_count_distinct":
        return F.approx_count_distinct(c, 0.016)
    if agg.fn == "approx_percentile":
        return F.percentile_approx(c, float(agg.arg("q")), 200)
    if agg.fn in ("first", "last"):
        pick = F.min_by if agg.fn == "first" else F.max_by
        return pick(c, F.when(c.isNotNull(), F.struct(et, c)))
    if agg.fn.endswith(":WeightedAvg"):
        v, w = (F.col(x) for x in agg.columns)
        both = v.isNotNull() & w.isNotNull()
        return F.sum(F.when(both, v * w)) / F.sum(F.when(both, w))
    if agg.fn.endswith(":VectorSum"):
        return F.sum(c)
    raise ValueError(f"no native baseline for {agg.fn}")


def fresh(path: Path) -> Path:
    """``path``, emptied."""
    shutil.rmtree(path, ignore_errors=True)
    return path


def landing(work: Path, days: int, events: int, name: str = "landing", files_per_day: int = 2) -> GenerateConfig:
    """The benchmark's sample events (generated once per size, then reused by every suite)."""
    config = GenerateConfig(out=str(work / name), days=days, rows_per_day=events // days, seed=7,
                            files_per_day=files_per_day)
    marker = work / f"{name}.json"
    wanted = json.dumps(dataclasses.asdict(config), sort_keys=True)
    if not marker.exists() or marker.read_text() != wanted:
        print(f"generating {config.rows_per_day * config.days:,} events over {config.days} days ...", flush=True)
        generate(config)
        marker.write_text(wanted)
    return config


def batch(args: argparse.Namespace) -> int:
    work = Path(args.work_dir)
    config = landing(work, args.days, args.events)
    landing_dir = Path(config.out)
    spark = build_session(SessionConfig(master=args.master or "local[*]",
                                        shuffle_partitions=args.shuffle_partitions or 8, app_name="bench"))
    lake = open_lake(spark)
    dates = config.dates
    spec = load_spec(SAMPLE, lake=str(work / "lake"), source_path=str(landing_dir))
    figures: dict[str, Any] = {"events": config.rows_per_day * config.days, "days": config.days,
                               "cores": os.cpu_count(), "spark_master": spark.sparkContext.master}

    def combine_reduce(s: PipelineSpec, day: str) -> None:
        combine.run(spark, s, day)
        reduce.run(spark, s)

    def baseline(s: PipelineSpec, days: list[str], target: Path) -> None:
        raw = spark.read.parquet(*(s.source.partition_path(d) for d in days))
        lake.append(one_shot(raw, s), str(fresh(target)))

    # warm up the JVM, the Python workers and the code paths, outside any figure
    warm = dataclasses.replace(spec, lake=str(fresh(work / "lake-warm")))
    combine_reduce(warm, dates[0])
    baseline(spec, [dates[0]], work / "baseline-warm")

    fresh(work / "lake")
    small = dataclasses.replace(spec, lake=str(fresh(work / "lake-small")))
    n_small = max(1, round(1_000_000 / config.rows_per_day))
    print(f"loading {n_small} days ({n_small * config.rows_per_day:,} events) for the memory baseline ...", flush=True)
    for day in dates[:n_small]:
        combine.run(spark, small, day)
    with PeakRss() as mem_small:
        reduce.run(spark, small, full=True)

    print(f"loading {len(dates) - 1} days into the lake ...", flush=True)
    t0 = time.perf_counter()
    with PeakRss() as mem_combine:
        for day in dates[:-1]:
            combine.run(spark, spec, day)
    figures["combine_initial_days_s"] = time.perf_counter() - t0
    figures["initial_reduce_s"] = _timed(lambda: reduce.run(spark, spec))

    print("measuring one fresh day, a backfill and the full reduce ...", flush=True)
    figures["fresh_day_combine_s"] = _timed(lambda: combine.run(spark, spec, dates[-1]))
    with CallTimer(changelog_feed, "tell_commits") as telling:  # the reduce's changelog rows, within it
        figures["fresh_day_reduce_s"] = _timed(lambda: reduce.run(spark, spec))
    figures["fresh_day_changelog_s"] = telling.seconds
    figures["fresh_day_s"] = figures["fresh_day_combine_s"] + figures["fresh_day_reduce_s"]
    figures["one_shot_day_s"] = _timed(lambda: baseline(spec, [dates[-1]], work / "baseline-day"))
    figures["backfill_day_s"] = _timed(lambda: combine_reduce(spec, dates[len(dates) // 2]))
    figures["noop_reduce_s"] = _timed(lambda: reduce.run(spark, spec))
    with PeakRss() as mem_large:
        figures["reduce_all_partials_s"] = _timed(lambda: reduce.run(spark, spec, full=True))
    figures["recompute_from_raw_s"] = _timed(lambda: baseline(spec, dates, work / "baseline-all"))
    partial_rows = sum(f.num_records or 0 for f in lake.files(PipelineTables(spec.lake, spec.name).partials))
    figures["partial_rows"] = partial_rows

    print("measuring a user-defined aggregate against the equivalent built-in ...", flush=True)
    days = dates[:5]
    timings = {}
    for label, fn in (("builtin", "sum"), ("udaf", "spark_jobs.aggregates.examples:VectorSum")):
        s = dataclasses.replace(spec, lake=str(fresh(work / f"lake-{label}")),
                                aggregates=(AggregateSpec("total_ms", fn, ("duration_ms",)),))
        combine_reduce(s, dates[-2])  # warm this path
        s = dataclasses.replace(s, lake=str(fresh(work / f"lake-{label}")))

        def load(s: PipelineSpec = s) -> None:
            for day in days:
                combine.run(spark, s, day)
            reduce.run(spark, s)

        timings[label] = _timed(load)
    figures["builtin_sum_5_days_s"], figures["udaf_sum_5_days_s"] = timings["builtin"], timings["udaf"]

    figures["driver_rss_growth_mb_1m"] = mem_small.growth_mb
    figures["driver_rss_growth_mb_10m"] = mem_large.growth_mb
    figures["driver_rss_growth_mb_combine"] = mem_combine.growth_mb
    ratios = {
        "fresh day (combine+reduce) / one-shot groupBy to Delta [target <= 1.2]":
            figures["fresh_day_s"] / figures["one_shot_day_s"],
        "the reduce's changelog rows / fresh day (combine+reduce) [target <= 0.15]":
            figures["fresh_day_changelog_s"] / figures["fresh_day_s"],
        "recompute from raw / daily reduce over 30 days of partials [target >= 20]":
            figures["recompute_from_raw_s"] / figures["fresh_day_reduce_s"],
        "recompute from raw / full re-merge of all 30 days of partials":
            figures["recompute_from_raw_s"] / figures["reduce_all_partials_s"],
        "backfill of one day / fresh day [target <= 1.3]": figures["backfill_day_s"] / figures["fresh_day_s"],
        "user-defined vectorised sum / built-in sum [target <= 2]":
            figures["udaf_sum_5_days_s"] / figures["builtin_sum_5_days_s"],
        "driver memory growth, 10M-event lake / 1M-event lake [target ~1, flat]":
            max(mem_large.growth_mb, 1.0) / max(mem_small.growth_mb, 1.0),
    }
    figures["ratios"] = ratios
    print()
    for key, value in figures.items():
        if key != "ratios":
            print(f"  {key:42s} {value:,.2f}" if isinstance(value, float) else f"  {key:42s} {value}")
    print()
    for key, value in ratios.items():
        print(f"  {value:7.2f}x  {key}")
    (work / "bench-batch.json").write_text(json.dumps(figures, indent=2))
    print(f"\nfigures written to {work / 'bench-batch.json'}")
    return 0
