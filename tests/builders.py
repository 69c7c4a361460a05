"""Small builders for test specs and landing data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from spark_jobs.spec import PipelineSpec, load_spec

SCHEMA = {"event_time": "timestamp", "user_id": "string", "page": "string", "duration_ms": "long",
          "weight": "double", "country": "string"}
ALL_AGGREGATES: list[dict[str, Any]] = [
    {"name": "views", "fn": "count"},
    {"name": "timed", "fn": "count", "column": "duration_ms"},
    {"name": "total_ms", "fn": "sum", "column": "duration_ms"},
    {"name": "min_ms", "fn": "min", "column": "duration_ms"},
    {"name": "max_ms", "fn": "max", "column": "duration_ms"},
    {"name": "avg_ms", "fn": "avg", "column": "duration_ms"},
    {"name": "countries", "fn": "count_distinct", "column": "country"},
    {"name": "users", "fn": "approx_count_distinct", "column": "user_id"},
    {"name": "p90_ms", "fn": "approx_percentile", "column": "duration_ms", "args": {"q": 0.9}},
    {"name": "first_user", "fn": "first", "column": "user_id"},
    {"name": "last_user", "fn": "last", "column": "user_id"},
    {"name": "weighted_ms", "fn": "spark_jobs.aggregates.examples:WeightedAvg", "columns": ["duration_ms", "weight"]},
]


def make_spec(root: Path, *, name: str = "views", window: dict[str, str] | None = None,
              group_by: list[str] | None = None, aggregates: list[dict[str, Any]] | None = None,
              fmt: str = "parquet", rollups: list[dict[str, Any]] | None = None,
              null_keys: str | None = None) -> PipelineSpec:
    raw: dict[str, Any] = {
        "name": name,
        "source": {"path": str(root / "landing"), "format": fmt, "event_time": "event_time", "schema": SCHEMA},
        "group_by": ["page"] if group_by is None else group_by,
        "aggregates": ALL_AGGREGATES if aggregates is None else aggregates,
        "lake": str(root / "lake"),
    }
    if null_keys is not None:
        raw["source"]["null_keys"] = null_keys
    if window is not None:
        raw["window"] = window
    if rollups is not None:
        raw["rollups"] = rollups
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_spec(path)


def write_day(landing: Path, date: str, table: pa.Table, files: int = 1) -> None:
    part = landing / f"event_date={date}"
    part.mkdir(parents=True, exist_ok=True)
    for old in part.glob("*"):
        old.unlink()
    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    for i in range(files):
        pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]), part / f"part-{i:05d}.parquet")


def events(rows: list[tuple[Any, ...]]) -> pa.Table:
    """(event_time, user_id, page, duration_ms, weight, country) tuples -> a landing table."""
    cols = list(zip(*rows, strict=True)) if rows else [[] for _ in SCHEMA]
    return pa.table({
        "event_time": pa.array(cols[0], pa.timestamp("us", tz="UTC")),
        "user_id": pa.array(cols[1], pa.string()),
        "page": pa.array(cols[2], pa.string()),
        "duration_ms": pa.array(cols[3], pa.int64()),
        "weight": pa.array(cols[4], pa.float64()),
        "country": pa.array(cols[5], pa.string()),
    })


# The built-in aggregates only: no Python UDAF, so a job needs no Python workers (faster tests).
FAST_AGGREGATES: list[dict[str, Any]] = [a for a in ALL_AGGREGATES if ":" not in a["fn"]]


def day_events(date: str, n: int, *, seed: int = 0, pages: tuple[str, ...] = ("/a", "/b", "/c"),
               rejected: int = 0) -> pa.Table:
    """``n`` deterministic events spread over ``date`` (UTC), plus ``rejected`` rows without an event time."""
    import datetime as dt
    import random

    rng = random.Random(f"{date}/{seed}")
    midnight = dt.datetime.fromisoformat(date).replace(tzinfo=dt.UTC)
    rows: list[tuple[Any, ...]] = []
    for _ in range(n):
        at = midnight + dt.timedelta(seconds=rng.randrange(86_400))
        ms = None if rng.random() < 0.1 else rng.randrange(10_000)
        rows.append((at, f"u{rng.randrange(30)}", rng.choice(pages), ms, rng.choice([0.5, 1.0, 2.0]),
                     rng.choice(["DE", "US", "FR", None])))
    for _ in range(rejected):  # rejected whatever source.null_keys says
        rows.append((None, "u0", "/a", 1, 1.0, "DE"))
    return events(rows)


def write_text(landing: Path, date: str, name: str, text: str) -> Path:
    """Write one text landing file (JSON lines, CSV) into the day's partition."""
    part = landing / f"event_date={date}"
    part.mkdir(parents=True, exist_ok=True)
    path = part / name
    path.write_text(text)
    return path


def killed_at(failpoint: str, *args: str, remote: str | None = None) -> None:
    """Run ``python -m spark_jobs ARGS`` (local Spark, or a client of the Connect server ``remote``; embedded Delta)
    and check it was killed with SIGKILL at ``failpoint``."""
    from spark_jobs.spark_session import ensure_java_home

    ensure_java_home()
    env = {**os.environ, "SPARK_JOBS_FAILPOINT": failpoint, "SPARK_JOBS_DELTA_BACKEND": "embedded",
           "PYSPARK_PYTHON": sys.executable}
    where = ["--remote", remote] if remote else ["--master", "local[1]"]
    done = subprocess.run([sys.executable, "-m", "spark_jobs", *args, *where, "--shuffle-partitions", "2"],
                          cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
