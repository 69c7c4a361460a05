"""``python -m spark_jobs bench batch``: the batch path against Spark's one-shot ``groupBy().agg()``.

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

from spark_jobs.jobs import combine, reduce
from spark_jobs.jobs.generate import GenerateConfig, generate
from spark_jobs.lake import PipelineTables, open_lake
from spark_jobs.session import SessionConfig, build_session
from spark_jobs.spec import AggregateSpec, PipelineSpec, load_spec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["run_bench"]

SAMPLE = Path(__file__).resolve().parent.parent / "pipelines" / "page_views.yaml"


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


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
    """Spark's single-phase aggregation of the spec's aggregates: the baseline."""
    from pyspark.sql import functions as F

    from spark_jobs.plan.phases import assign_windows

    et = F.col(spec.source.event_time)
    valid = raw.where(et.isNotNull() & F.col(spec.group_by[0]).isNotNull()) if spec.group_by else raw
    rows = assign_windows(valid, spec)

    def native(agg: AggregateSpec) -> Column:
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

    return rows.groupBy(*spec.key_columns).agg(*(native(a).alias(a.name) for a in spec.aggregates),
                                               F.count(F.lit(1)).alias("n_rows"))


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    return path


def batch(args: argparse.Namespace) -> int:
    work = Path(args.work_dir)
    landing = work / "landing"
    config = GenerateConfig(out=str(landing), days=args.days, rows_per_day=args.events // args.days, seed=7,
                            files_per_day=2)
    marker = work / "landing.json"
    wanted = json.dumps(dataclasses.asdict(config), sort_keys=True)
    if not marker.exists() or marker.read_text() != wanted:
        print(f"generating {config.rows_per_day * config.days:,} events over {config.days} days ...", flush=True)
        generate(config)
        marker.write_text(wanted)
    spark = build_session(SessionConfig(master=args.master or "local[*]",
                                        shuffle_partitions=args.shuffle_partitions or 8, app_name="bench"))
    lake = open_lake(spark)
    dates = config.dates
    spec = load_spec(SAMPLE, lake=str(work / "lake"), source_path=str(landing))
    figures: dict[str, Any] = {"events": config.rows_per_day * config.days, "days": config.days,
                               "cores": os.cpu_count(), "spark_master": spark.sparkContext.master}

    def combine_reduce(s: PipelineSpec, day: str) -> None:
        combine.run(spark, s, day)
        reduce.run(spark, s)

    def baseline(s: PipelineSpec, days: list[str], target: Path) -> None:
        raw = spark.read.parquet(*(s.source.partition_path(d) for d in days))
        lake.append(one_shot(raw, s), str(_fresh(target)))

    # warm up the JVM, the Python workers and the code paths, outside any figure
    warm = dataclasses.replace(spec, lake=str(_fresh(work / "lake-warm")))
    combine_reduce(warm, dates[0])
    baseline(spec, [dates[0]], work / "baseline-warm")

    _fresh(work / "lake")
    small = dataclasses.replace(spec, lake=str(_fresh(work / "lake-small")))
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
    figures["fresh_day_reduce_s"] = _timed(lambda: reduce.run(spark, spec))
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
        s = dataclasses.replace(spec, lake=str(_fresh(work / f"lake-{label}")),
                                aggregates=(AggregateSpec("total_ms", fn, ("duration_ms",)),))
        combine_reduce(s, dates[-2])  # warm this path
        s = dataclasses.replace(s, lake=str(_fresh(work / f"lake-{label}")))

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


STREAM_AGGREGATES = ("views", "total_ms", "max_ms", "avg_ms", "users", "p95_ms")


def _time_ordered_landing(work: Path, events: int, days: int, files: int) -> Path:
    """Sample events re-landed as ``files`` files in event-time order, as a live source lands them."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    generated = work / "generated"
    config = GenerateConfig(out=str(generated), days=days, rows_per_day=events // days, seed=7, files_per_day=2)
    landing = work / "stream-landing"
    marker = work / "stream-landing.json"
    wanted = json.dumps({**dataclasses.asdict(config), "files": files}, sort_keys=True)
    if marker.exists() and marker.read_text() == wanted:
        return landing
    print(f"generating {events:,} events over {days} days in {files} time-ordered files ...", flush=True)
    generate(dataclasses.replace(config, out=str(_fresh(generated))))
    _fresh(landing)
    per_day = max(1, files // days)
    stamp = 1_700_000_000
    for date in config.dates:
        day = pq.read_table(f"{generated}/event_date={date}")
        day = day.filter(pc.is_valid(day["event_time"])).sort_by("event_time")
        step = -(-day.num_rows // per_day)
        (landing / f"event_date={date}").mkdir(parents=True)
        for i in range(per_day):
            path = landing / f"event_date={date}" / f"part-{i:05d}.parquet"
            pq.write_table(day.slice(i * step, step), path)
            stamp += 10
            os.utime(path, (stamp, stamp))
    marker.write_text(wanted)
    return landing


def _stream_spec(work: Path, landing: Path, name: str, files_per_batch: int, trigger: int = 5) -> PipelineSpec:
    from spark_jobs.spec import Duration

    spec = load_spec(SAMPLE, lake=str(_fresh(work / name)), source_path=str(landing))
    return dataclasses.replace(
        spec, aggregates=tuple(a for a in spec.aggregates if a.name in STREAM_AGGREGATES),
        stream=dataclasses.replace(spec.stream, max_files_per_batch=files_per_batch, trigger=Duration(trigger)))


def spark_windowed_stream(spark: Any, spec: PipelineSpec, lake: Any, checkpoint: Path) -> None:
    """Spark's built-in streaming aggregation of the same aggregates (watermark, update mode), each
    batch's updated rows appended to Delta through the same commit path: the baseline."""
    from spark_jobs.jobs.stream import landed_rows

    rows = landed_rows(spark.readStream.option("maxFilesPerTrigger", spec.stream.max_files_per_batch), spec,
                       None).withWatermark(spec.source.event_time, spec.stream.watermark.spark)
    target = str(_fresh(Path(spec.lake) / "spark_builtin"))

    def sink(df: DataFrame, batch_id: int) -> None:
        lake.append(df, target)

    query = (one_shot(rows, spec).writeStream.outputMode("update").foreachBatch(sink)
             .option("checkpointLocation", str(_fresh(checkpoint))).trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))


def _files_by_batch(checkpoint: str) -> dict[str, int]:
    """Landing file -> the mini-batch id that read it, from the file source's checkpoint log."""
    out: dict[str, int] = {}
    for log in Path(checkpoint, "sources", "0").glob("*"):
        if not (log.name.isdigit() or log.name.endswith(".compact")):
            continue  # .crc and temporary files
        for line in log.read_text().splitlines()[1:]:
            entry = json.loads(line)
            out[entry["path"].removeprefix("file://")] = int(entry["batchId"])
    return out


def stream(args: argparse.Namespace) -> int:
    """Throughput for a few mini-batch sizes against Spark's own windowed streaming aggregation,
    end-to-end latency with small mini-batches, and state writes per input row."""
    import numpy as np
    import pyarrow.parquet as pq

    from spark_jobs.jobs import stream as stream_job

    work = Path(args.work_dir)
    files = args.files or 100
    landing = _time_ordered_landing(work, args.events, args.days, files)
    spark = build_session(SessionConfig(master=args.master or "local[*]",
                                        shuffle_partitions=args.shuffle_partitions or 4, app_name="bench stream"))
    lake = open_lake(spark)
    paths = sorted(landing.rglob("*.parquet"))
    rows_total = sum(pq_rows(f) for f in paths)
    figures: dict[str, Any] = {"events": rows_total, "files": len(paths), "cores": os.cpu_count(),
                               "spark_master": spark.sparkContext.master}
    print("warming up ...", flush=True)
    warm = _stream_spec(work, landing, "lake-warm", 1)
    warm = warm.with_paths(source_path=str(_fresh(work / "warm-landing")))
    (work / "warm-landing" / "event_date=2024-03-01").mkdir(parents=True)
    shutil.copy(paths[0], work / "warm-landing" / "event_date=2024-03-01" / paths[0].name)
    stream_job.run(spark, warm, available_now=True)
    spark_windowed_stream(spark, warm, lake, work / "ckpt-warm-spark")

    sizes = [int(x) for x in (args.batch_files or "5,20,50").split(",") if int(x) > 0]  # "0": latency only
    for size in sizes:
        print(f"mini-batches of {size} files ({size * rows_total // len(paths):,} events) ...", flush=True)
        spec = _stream_spec(work, landing, f"lake-stream-{size}", size)
        start = time.perf_counter()
        summary = stream_job.run(spark, spec, available_now=True)
        ours = time.perf_counter() - start
        base_spec = _stream_spec(work, landing, f"lake-spark-{size}", size)
        start = time.perf_counter()
        spark_windowed_stream(spark, base_spec, lake, work / f"ckpt-spark-{size}")
        base = time.perf_counter() - start
        done = summary.batches
        writes = sum(b.state_writes for b in done)
        aggregated = sum(b.rows_aggregated for b in done)
        figures[f"batch{size}"] = {
            "mini_batches": len(done), "ours_s": ours, "spark_s": base,
            "ours_events_per_s": rows_total / ours, "spark_events_per_s": rows_total / base,
            "ours_over_spark_throughput": base / ours,
            "state_writes_per_row": writes / max(aggregated, 1),
            "mean_rows_per_key_per_batch": aggregated / max(writes, 1),
        }

    print("latency: small files landing while the stream runs ...", flush=True)
    latency_files = args.latency_files
    # each trigger takes every file landed since the last one: a one-file cap would make the
    # stream fall behind by construction whenever files land faster than the trigger fires
    spec = _stream_spec(work, landing, "lake-latency", 100, trigger=args.trigger)
    live = work / "live-landing"
    _fresh(live)
    spec = spec.with_paths(source_path=str(live))
    stop = threading.Event()
    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.update(summary=stream_job.run(spark, spec, stop=stop)),
                              daemon=True)
    sources = sorted(landing.rglob("*.parquet"))[:latency_files]
    (live / "event_date=2024-03-01").mkdir(parents=True)
    # a first file before the stream starts, so the query has something to plan on start
    landed: dict[str, float] = {}
    for i, src in enumerate(sources):
        if i == 1:
            runner.start()
        table = pq.read_table(src).slice(0, args.latency_rows)
        dest = live / "event_date=2024-03-01" / f"live-{i:04d}.parquet"
        tmp = dest.with_name(f".{dest.name}.tmp")  # hidden: the file source skips it until the rename
        pq.write_table(table, tmp)
        os.replace(tmp, dest)
        landed[str(dest)] = time.time()
        time.sleep(args.latency_interval)
    deadline = time.time() + 120
    tables = PipelineTables(spec.lake, spec.name)
    while time.time() < deadline:  # until every landed file's batch is visible in aggregates
        batches = _files_by_batch(tables.stream_checkpoint)
        seen = lake.txn_version(tables.aggregates, stream_job.app_id(spec))
        if len(batches) >= len(landed) and seen is not None and max(batches.values()) <= seen:
            break
        time.sleep(0.5)
    stop.set()
    runner.join()
    visible = {b.batch_id: b.visible_at for b in result["summary"].batches if b.visible_at}
    by_batch = _files_by_batch(tables.stream_checkpoint)
    lat = np.array([visible[by_batch[f]] - t for f, t in landed.items() if by_batch.get(f) in visible])
    figures["latency"] = {"trigger_s": args.trigger, "files": len(landed), "rows_per_file": args.latency_rows,
                          "interval_s": args.latency_interval, "measured": len(lat),
                          "mini_batches": len(visible),
                          "p50_s": float(np.percentile(lat, 50)), "p95_s": float(np.percentile(lat, 95))}

    print()
    for key, value in figures.items():
        if isinstance(value, dict):
            print(f"  {key}:")
            for k, v in value.items():
                print(f"    {k:32s} {v:,.3f}" if isinstance(v, float) else f"    {k:32s} {v}")
        else:
            print(f"  {key:34s} {value}")
    print()
    for size in sizes:
        f = figures[f"batch{size}"]
        print(f"  {f['ours_events_per_s']:>12,.0f} events/s  ours, {size}-file mini-batches [target >= 250,000 "
              f"for large ones]; {f['ours_over_spark_throughput']:.2f}x Spark's built-in windowed streaming "
              f"aggregation [target >= 0.8]; {f['state_writes_per_row']:.4f} state writes per row = 1 / "
              f"{f['mean_rows_per_key_per_batch']:.1f} rows per key per batch")
    lat_f = figures["latency"]
    print(f"  latency p50 {lat_f['p50_s']:.2f} s, p95 {lat_f['p95_s']:.2f} s with a {args.trigger} s trigger "
          f"[target p50 <= trigger + 2 s]")
    (work / "bench-stream.json").write_text(json.dumps(figures, indent=2))
    print(f"\nfigures written to {work / 'bench-stream.json'}")
    return 0


def pq_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def run_bench(args: argparse.Namespace) -> int:
    if args.suite == "batch":
        return batch(args)
    if args.suite == "stream":
        return stream(args)
    raise ValueError(f"unknown benchmark {args.suite!r}")
