"""``python -m benchmarks evolution``: ``apply`` of a spec change against recomputing the tables from raw rows.

The sample pipeline grouped by page and country (hourly windows, eight aggregates including sketches and a
user-defined one) over N days, loaded once by combine and reduce. Each change is applied to a fresh copy of
that lake, and the same tables are recomputed from the raw rows with Spark (combine of every day, then
reduce), in the same process:

- a window coarsened (1 hour -> 1 day) and a key dropped (country): re-derived from the stored
  accumulators, in Arrow and in Spark (target: >= 20x faster than recomputing);
- an aggregate added: a schema change (target: <= 5 s), in process and as the command a user types
  (``python -m spark_jobs apply``, cold start included).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.batch_bench import SAMPLE, fresh
from spark_jobs.jobs import combine, reduce
from spark_jobs.jobs.apply import apply
from spark_jobs.jobs.generate import GenerateConfig, generate
from spark_jobs.spark_session import SessionConfig, build_session
from spark_jobs.spec import PipelineSpec, load_spec

__all__ = ["evolution_bench"]

LAYOUT = 2  # of the cached lake: bump when the tables change shape (2: spec records)


def _spec(work: Path, name: str, edit: Any, landing: str, lake: Path) -> PipelineSpec:
    raw = yaml.safe_load(SAMPLE.read_text())
    raw["group_by"] = ["page", "country"]
    raw["rollups"] = [{"name": "daily", "grain": "1 day", "by": ["page"]}]
    raw["source"]["path"], raw["lake"] = landing, str(lake)
    edit(raw)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_spec(path)


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def evolution_bench(args: argparse.Namespace) -> int:
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    config = GenerateConfig(out=str(work / "landing-evolution"), days=args.days, rows_per_day=args.events // args.days,
                            seed=7, files_per_day=2)
    spark = build_session(SessionConfig(master=args.master or "local[*]", shuffle_partitions=args.shuffle_partitions,
                                        app_name="bench-evolution"))
    base_lake = work / "lake-evolution"
    base = _spec(work, "evolution-v1", lambda r: None, config.out, base_lake)
    marker = work / "lake-evolution.json"
    wanted = json.dumps({**dataclasses.asdict(config), "layout": LAYOUT}, sort_keys=True)
    if not marker.exists() or marker.read_text() != wanted:
        print(f"generating and loading {config.rows_per_day * config.days:,} events over {config.days} days ...",
              flush=True)
        generate(config)
        fresh(base_lake)
        for day in config.dates:
            combine.run(spark, base, day)
        reduce.run(spark, base)
        marker.write_text(wanted)

    def coarsen(r: dict[str, Any]) -> None:
        r["window"] = {"size": "1 day"}

    def drop_key(r: dict[str, Any]) -> None:
        r["group_by"] = ["page"]

    def add(r: dict[str, Any]) -> None:
        r["aggregates"].append({"name": "p99_ms", "fn": "approx_percentile", "column": "duration_ms",
                                "args": {"q": 0.99}})

    figures: dict[str, Any] = {"events": config.rows_per_day * config.days, "days": config.days}

    def copy(name: str) -> Path:
        target = fresh(work / f"lake-evolution-{name}")
        shutil.copytree(base_lake, target)
        return target

    def recompute(spec: PipelineSpec) -> float:
        scratch = dataclasses.replace(spec, lake=str(fresh(work / "lake-evolution-scratch")))

        def run() -> None:
            for day in config.dates:
                combine.run(spark, scratch, day)
            reduce.run(spark, scratch)

        return _timed(run)[0]

    # warm the JVM and the code paths outside any figure
    warm = _spec(work, "evolution-warm", coarsen, config.out, copy("warm"))
    apply(warm, spark=lambda: spark, engine="spark")
    for label, edit in (("window 1 hour -> 1 day", coarsen), ("key country dropped", drop_key)):
        entry: dict[str, Any] = {}
        for engine in ("arrow", "spark"):
            spec = _spec(work, f"evolution-{engine}", edit, config.out, copy(engine))
            seconds, result = _timed(lambda s=spec, e=engine: apply(s, spark=lambda: spark, engine=e))
            entry[f"apply_{engine}_s"] = seconds
            entry["rows_rewritten"] = result.plan.table_rows
        entry["recompute_s"] = recompute(spec)
        best = min(entry["apply_arrow_s"], entry["apply_spark_s"])
        entry["speedup"] = entry["recompute_s"] / best
        figures[label] = entry
        print(f"  {label:24s}: apply {entry['apply_arrow_s']:6.2f} s (arrow) / {entry['apply_spark_s']:6.2f} s (spark) "
              f"vs recompute from raw {entry['recompute_s']:7.2f} s: {entry['speedup']:6.1f}x faster  [target >= 20x]",
              flush=True)

    spec = _spec(work, "evolution-add", add, config.out, copy("add"))
    seconds, _ = _timed(lambda: apply(spec))
    cli_spec = _spec(work, "evolution-add-cli", add, config.out, copy("add-cli"))
    command = [sys.executable, "-m", "spark_jobs", "apply", "--pipeline", cli_spec.origin]
    cli_s, proc = _timed(lambda: subprocess.run(command, capture_output=True, text=True, check=False))
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return 1
    figures["aggregate added"] = {"apply_s": seconds, "cli_wall_s": cli_s}
    print(f"  {'aggregate added':24s}: apply {seconds:6.2f} s in process, {cli_s:6.2f} s as "
          "`python -m spark_jobs apply` (cold start)  [target <= 5 s]", flush=True)
    (work / "bench-evolution.json").write_text(json.dumps(figures, indent=2, default=str))
    print(f"\nfigures written to {work / 'bench-evolution.json'}")
    return 0
