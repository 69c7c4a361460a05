"""``python -m benchmarks sessions``: session windows per user, against Spark's one-shot ``session_window``.

The sample's built-in aggregates over the 10M-event data, keyed by ``user_id`` with ``window: {gap: 30 minutes}``, loaded
day by day (combine, then reduce). In the same process, Spark's own single-phase aggregation
``groupBy(user_id, session_window(event_time, "30 minutes"))`` of the same aggregates, written to Delta through
the same commit path, is the baseline:

- combine + reduce of a fresh day against the one-shot aggregation of that day (target <= 1.3x);
- the daily reduce (the fresh day's partial sessions merged with every other day's, for the users it touched)
  against recomputing all days from raw in one shot (target >= 20x faster);
- the stream over the same events re-landed as time-ordered files (as ``benchmarks stream`` lands them) against
  Spark Structured Streaming's ``session_window`` aggregation of the same files, mini-batches of the same size,
  each batch's output appended to Delta (target >= 1.5x);
- each of our mini-batches' time, and the last one's over the first's (target <= 1.3x): a batch should cost what
  its events cost, not more as the sessions' history grows;
- with ``--peer flink``, Flink 2.3's SESSION window TVF per user with the same gap over the same files (as CSV, the
  stream benchmark's harness), its first and warm run, checked to count every event (target ours >= 1.5x).

``--parts batch`` or ``--parts stream`` runs one half; ``--peer`` picks the stream's peers (``spark`` by default,
``none`` for ours alone).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.batch_bench import SAMPLE, fresh, landing, native_aggregate
from benchmarks.stream_bench import baseline_rows, pq_rows, time_ordered_landing
from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables, open_lake
from spark_jobs.spark_session import SessionConfig, build_session
from spark_jobs.spec import Duration, PipelineSpec, load_spec
from spark_jobs.windows import Sessions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["sessions_bench"]

GAP = Duration(1800)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def one_shot_sessions(raw: DataFrame, spec: PipelineSpec) -> DataFrame:
    """Spark alone: ``session_window`` in one ``groupBy`` with its built-in aggregate functions."""
    from pyspark.sql import functions as F

    et = F.col(spec.source.event_time)
    valid = raw.where(et.isNotNull() & F.col(spec.group_by[0]).isNotNull())
    session = F.session_window(et, GAP.spark)
    rows = valid.groupBy(*spec.group_by, session.alias("session")).agg(
        *(native_aggregate(a, et).alias(a.name) for a in spec.aggregates), F.count(F.lit(1)).alias("n_rows"))
    return rows.select(*spec.group_by, F.col("session.start").alias("window_start"),
                       F.col("session.end").alias("window_end"), *(a.name for a in spec.aggregates), "n_rows")


def spark_session_stream(spark: Any, spec: PipelineSpec, lake: Any, checkpoint: Path) -> None:
    """Spark Structured Streaming's ``session_window`` aggregation of the same aggregates (watermark, append
    mode: the only one Spark allows for sessions), each batch's closed sessions appended to Delta."""
    rows = baseline_rows(spark, spec).withWatermark(spec.source.event_time, spec.stream.watermark.spark)
    target = str(fresh(Path(spec.lake) / "spark_builtin"))
    query = (one_shot_sessions(rows, spec).writeStream.outputMode("append")
             .foreachBatch(lambda df, _: lake.append(df, target))
             .option("checkpointLocation", str(fresh(checkpoint))).trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))


def _stream_figures(spark: Any, lake: Any, spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    """Ours once per mini-batch size, and each peer asked for over the same files."""
    work = Path(args.work_dir)
    source = time_ordered_landing(work, args.events, args.days, args.files)
    events = sum(pq_rows(f) for f in source.rglob("*.parquet"))
    figures: dict[str, Any] = {"events": events}
    for size in (int(x) for x in args.batch_files.split(",")):
        print(f"stream: mini-batches of {size} files ...", flush=True)

        def spec_for(name: str, size: int = size) -> PipelineSpec:
            return dataclasses.replace(spec.with_paths(lake=str(fresh(work / name)), source_path=str(source)),
                                       stream=dataclasses.replace(spec.stream, max_files_per_batch=size))

        figures[f"batch{size}"] = ours = _ours(spark, spec_for(f"lake-sessions-stream-{size}"), events)
        if "spark" in args.peer:
            base, checkpoint = spec_for(f"lake-sessions-sss-{size}"), work / f"ckpt-sessions-sss-{size}"
            start = time.perf_counter()
            spark_session_stream(spark, base, lake, checkpoint)
            base_s = time.perf_counter() - start
            ours.update(spark_s=base_s, spark_events_per_s=events / base_s, ours_over_spark=base_s / ours["ours_s"])
    if "flink" in args.peer:
        figures["flink"] = flink = _flink_sessions(work, source, events, args.days)
        for f in (v for k, v in figures.items() if k.startswith("batch")):
            f.update(ours_over_flink=f["ours_events_per_s"] / flink["events_per_s"],
                     ours_over_flink_warm=f["ours_events_per_s"] / flink["warm_events_per_s"])
    return figures


def _ours(spark: Any, spec: PipelineSpec, events: int) -> dict[str, Any]:
    """Our session stream over the files, available-now: its time, events/s and each mini-batch's time."""
    from spark_jobs.stream import query as stream

    start = time.perf_counter()
    summary = stream.run(spark, spec, available_now=True)
    ours_s = time.perf_counter() - start
    return {"mini_batches": len(summary.batches), "ours_s": ours_s, "ours_events_per_s": events / ours_s,
            "on_driver": sum(b.on_driver for b in summary.batches), **_per_batch(summary.batches)}


def _keyed_events(source: Path) -> int:
    """The landing files' events with a user: those a session per user counts (the spec rejects the others)."""
    import pyarrow.parquet as pq

    return sum(t.num_rows - t.column("user_id").null_count
               for t in (pq.read_table(f, columns=["user_id"]) for f in sorted(source.rglob("*.parquet"))))


def _flink_sessions(work: Path, source: Path, events: int, days: int) -> dict[str, Any]:
    """Flink 2.3's SESSION window TVF per user, the same gap, over the same files: its figures, and whether it
    counted every event with a user."""
    from benchmarks.flink_peer import FlinkQuery, flink_peer

    # its parallel split readers read the time-ordered files out of order: with the spec's 10-minute watermark most
    # events would be late (dropped, or cutting sessions short), so its watermark allows the whole span and every
    # session closes at the end of the input
    flink = flink_peer(work, source, parallelism=os.cpu_count() or 2, watermark_minutes=(days + 1) * 24 * 60,
                       query=FlinkQuery("session", GAP.seconds // 60))
    keyed = _keyed_events(source)
    flink.update(events_keyed=keyed, counted_every_event=flink["events_counted"] == keyed,
                 events_per_s=events / flink["job_s"], warm_events_per_s=events / flink["warm_job_s"])
    return flink


def _per_batch(batches: list[Any]) -> dict[str, Any]:
    """Each mini-batch's time and the last one's over the first's. A batch's time is its phases' sum, from its file
    list to its last commit: the query's start is no batch's, and a batch handed off to the commit thread is timed
    whole though its commits overlap the next batch's read (``since_commit_s``, between two batches' ``aggregates``
    commits, is the stream's wall clock). A last batch of fewer files than the first is compared per event too."""
    done = sorted((b for b in batches if b.rows_in and not b.replayed), key=lambda b: b.batch_id)
    rows: list[dict[str, Any]] = []
    for i, b in enumerate(done):
        before = done[i - 1].visible_at if i else None
        since = b.visible_at - before if before is not None and b.visible_at is not None else None
        rows.append({"batch_id": b.batch_id, "events": b.rows_in, "seconds": sum(b.phases.seconds.values()),
                     "since_commit_s": since, "on_driver": b.on_driver, "phases": dict(b.phases.seconds)})
    if not rows or not rows[0]["seconds"]:
        return {"per_batch": rows}
    first, last = rows[0], rows[-1]
    return {"per_batch": rows, "last_over_first": last["seconds"] / first["seconds"],
            "last_over_first_per_event": last["seconds"] / last["events"] / (first["seconds"] / first["events"])}


def _print_stream(stream: dict[str, Any]) -> None:
    for size, f in ((k.removeprefix("batch"), v) for k, v in stream.items() if k.startswith("batch")):
        print(f"  stream, {size}-file mini-batches: {f['ours_s']:6.1f} s ({f['ours_events_per_s']:,.0f} events/s)",
              flush=True)
        if "spark_s" in f:
            print(f"    vs Spark Structured Streaming's session_window {f['spark_s']:6.1f} s "
                  f"({f['spark_events_per_s']:,.0f} events/s): {f['ours_over_spark']:.2f}x  [target >= 1.5x]")
        for b in f["per_batch"]:
            since = "" if b["since_commit_s"] is None else f", {b['since_commit_s']:6.1f} s since the last commit"
            phases = ", ".join(f"{name} {s:.1f}" for name, s in b["phases"].items() if s >= 0.05)  # all in the JSON
            print(f"    mini-batch {b['batch_id']:3d}: {b['events']:>11,} events {b['seconds']:7.1f} s{since} "
                  f"({'driver' if b['on_driver'] else 'Spark'}; {phases})")
        if "last_over_first" in f:
            print(f"    last mini-batch / first mini-batch: {f['last_over_first']:.2f}x "
                  f"({f['last_over_first_per_event']:.2f}x per event)  [target <= 1.3]", flush=True)
    if "flink" in stream:
        _print_flink(stream)


def _print_flink(stream: dict[str, Any]) -> None:
    f = stream["flink"]
    print(f"  Flink 2.3 local SESSION per user, gap {f['minutes']} minutes (mini-batch; one phase: Flink plans no "
          f"local-global session aggregation; exact COUNT DISTINCT and PERCENTILE for our sketches, no first): "
          f"{f['job_s']:.1f} s, {f['events_per_s']:,.0f} events/s ({f['command_s']:.1f} s with its JVM's start and "
          f"a second run); run again in its JVM, warm: {f['warm_job_s']:.1f} s, {f['warm_events_per_s']:,.0f} "
          f"events/s")
    if f["counted_every_event"]:
        print(f"    Flink counted every event with a user: {f['events_counted']:,}")
    else:
        print(f"\n  !!! FLINK DID NOT COUNT EVERY EVENT: {f['events_counted']:,} counted in its sessions, "
              f"{f['events_keyed']:,} events with a user in the files: its figures are not comparable !!!\n")
    for size, b in ((k.removeprefix("batch"), v) for k, v in stream.items() if k.startswith("batch")):
        print(f"  ours at {size}-file mini-batches / Flink: {b['ours_over_flink']:.2f}x its first run, "
              f"{b['ours_over_flink_warm']:.2f}x its warm run  [target >= 1.5x]", flush=True)


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def sessions_bench(args: argparse.Namespace) -> int:
    work = Path(args.work_dir)
    config = landing(work, args.days, args.events)
    # Structured Streaming keeps its sessions' state in RocksDB: in the JVM heap (the default) its first 20-file
    # mini-batch runs out of memory at 2 and at 8 GB (a percentile_approx buffer per open session)
    spark = build_session(SessionConfig(master=args.master or "local[*]",
                                        shuffle_partitions=args.shuffle_partitions or 8, app_name="bench-sessions",
                                        extra=(("spark.sql.streaming.stateStore.providerClass", ROCKSDB),)))
    lake = open_lake(spark)
    sample = load_spec(SAMPLE, lake=str(work / "lake-sessions"), source_path=config.out)
    builtin = tuple(a for a in sample.aggregates if not a.user_defined)  # per-session Python calls are not the point
    spec = dataclasses.replace(sample, group_by=("user_id",), window=Sessions(GAP), rollups=(), aggregates=builtin)
    dates = config.dates

    def baseline(days: list[str], target: Path) -> None:
        raw = spark.read.parquet(*(spec.source.partition_path(d) for d in days))
        lake.append(one_shot_sessions(raw, spec), str(fresh(target)))

    print("warming up ...", flush=True)
    warm = dataclasses.replace(spec, lake=str(fresh(work / "lake-sessions-warm")))
    combine.run(spark, warm, dates[0])
    reduce.run(spark, warm)
    baseline([dates[0]], work / "baseline-sessions-warm")
    figures: dict[str, Any] = {"events": config.rows_per_day * config.days, "days": config.days, "gap": str(GAP)}
    if "stream" in args.parts:
        figures["stream"] = _stream_figures(spark, lake, spec, args)
        _print_stream(figures["stream"])
    if "batch" not in args.parts:
        (work / "bench-sessions.json").write_text(json.dumps(figures, indent=2))
        return 0

    fresh(Path(spec.lake))
    print(f"loading {len(dates) - 1} days of sessions ...", flush=True)
    figures["combine_initial_days_s"] = _timed(lambda: [combine.run(spark, spec, d) for d in dates[:-1]])
    figures["initial_reduce_s"] = _timed(lambda: reduce.run(spark, spec))
    figures["fresh_day_combine_s"] = _timed(lambda: combine.run(spark, spec, dates[-1]))
    figures["daily_reduce_s"] = _timed(lambda: reduce.run(spark, spec))
    figures["fresh_day_s"] = figures["fresh_day_combine_s"] + figures["daily_reduce_s"]
    figures["one_shot_day_s"] = _timed(lambda: baseline([dates[-1]], work / "baseline-sessions-day"))
    figures["recompute_all_s"] = _timed(lambda: baseline(dates, work / "baseline-sessions-all"))
    tables = PipelineTables(spec.lake, spec.name)
    figures["sessions"] = sum(f.num_records or 0 for f in lake.files(tables.aggregates))
    figures["partial_sessions"] = sum(f.num_records or 0 for f in lake.files(tables.partials))
    figures["fresh_day_ratio"] = figures["fresh_day_s"] / figures["one_shot_day_s"]
    figures["daily_reduce_speedup"] = figures["recompute_all_s"] / figures["daily_reduce_s"]
    print(f"  fresh day: combine + reduce {figures['fresh_day_s']:6.2f} s vs one-shot session_window "
          f"{figures['one_shot_day_s']:6.2f} s: {figures['fresh_day_ratio']:.2f}x  [target <= 1.3x]")
    print(f"  daily reduce {figures['daily_reduce_s']:6.2f} s vs recomputing all {config.days} days "
          f"{figures['recompute_all_s']:6.2f} s: {figures['daily_reduce_speedup']:.1f}x faster  [target >= 20x]")
    print(f"  {figures['sessions']:,} sessions from {figures['partial_sessions']:,} partial sessions")
    (work / "bench-sessions.json").write_text(json.dumps(figures, indent=2))
    print(f"\nfigures written to {work / 'bench-sessions.json'}")
    return 0
