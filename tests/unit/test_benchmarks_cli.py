"""``python -m benchmarks``: its suites' options and defaults (the benchmarks themselves are not run here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_each_suite_has_its_options_and_defaults():
    parse = build_parser().parse_args
    batch = parse(["batch"])
    assert (batch.days, batch.events, batch.work_dir, batch.master, batch.shuffle_partitions) == (
        30, 10_000_000, "/tmp/spark_jobs_bench", None, None)
    stream = parse(["stream", "--days", "2", "--files", "100", "--batch-files", "0"])
    assert (stream.days, stream.files, stream.batch_files, stream.trigger, stream.latency_files, stream.latency_rows,
            stream.latency_interval) == (2, 100, "0", [1, 2], 40, 5000, 1.0)
    assert parse(["stream", "--trigger", "2"]).trigger == [2]
    with pytest.raises(SystemExit):
        parse(["stream", "--trigger", "0,x"])
    airflow = parse(["airflow"])
    assert (airflow.days, airflow.rows_per_day, airflow.max_active_runs, airflow.parallelism, airflow.timeout,
            airflow.driver_memory) == (10, 100_000, 3, 6, 3600, "2g")
    assert (parse(["rollup"]).days, parse(["rollup"]).events) == (30, 10_000_000)
    scale = parse(["scale"])
    assert (scale.days, scale.sizes, scale.shuffle_partitions) == (30, "10000000,40000000", None)
    with pytest.raises(SystemExit):
        parse(["airflow", "--files", "3"])  # a stream option
    with pytest.raises(SystemExit):
        parse(["scale", "--events", "5"])  # sizes, not one size


def test_the_benchmarks_run_from_the_repo_root_and_are_not_a_spark_jobs_command():
    run = [sys.executable, "-m", "benchmarks", "airflow", "--days", "0"]
    proc = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3 and "--days must be at least 1, got 0" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "scale", "--sizes", "10"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "bad --sizes '10'; give two or more event counts" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "spark_jobs", "bench", "batch"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "invalid choice: 'bench'" in proc.stderr
