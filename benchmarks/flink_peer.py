"""``benchmarks stream --peer flink`` and ``benchmarks sessions --peer flink``: Flink 2.3's local mini-cluster over
the same events, in the same run (a tumbling window per page, or a session window per user: :class:`FlinkQuery`).

``apache-flink`` goes into its own virtual environment under the work dir (its pins conflict with ours), the
time-ordered Parquet landing files are mirrored once as CSV (the wheel has CSV and JSON formats, not Parquet),
and :mod:`benchmarks.flink_job` runs there as a subprocess. Only when asked: no test depends on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from benchmarks.batch_bench import fresh
from benchmarks.flink_job import VIEWS_COLUMN

__all__ = ["FLINK", "FlinkQuery", "flink_peer"]

FLINK = "apache-flink==2.3.*"
INSTALL_TIMEOUT_S = 1800
JOB_TIMEOUT_S = 3600


@dataclass(frozen=True)
class FlinkQuery:
    """What :mod:`benchmarks.flink_job` computes: ``tumble`` per page with windows of ``minutes``, or ``session``
    per user with a gap of ``minutes`` (and the exact PERCENTILE unless ``percentile`` is false)."""

    kind: Literal["tumble", "session"]
    minutes: int
    percentile: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("tumble", "session") or self.minutes < 1:
            raise ValueError(f"bad Flink query {self.kind!r} of {self.minutes} minutes: give tumble or session "
                             f"and whole minutes >= 1")

    def args(self) -> list[str]:
        """flink_job's arguments for this query."""
        if self.kind == "tumble":
            return ["--query", "tumble", "--window-minutes", str(self.minutes)]
        return ["--query", "session", "--gap-minutes", str(self.minutes),
                *([] if self.percentile else ["--no-percentile"])]


def _venv(work: Path) -> Path:
    """The Flink virtual environment's Python, created and installed once."""
    venv = work / "flink-venv"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if marker.exists() and marker.read_text() == FLINK:
        return python
    print(f"installing {FLINK} into {venv} (once; a few minutes) ...", flush=True)
    fresh(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    try:
        subprocess.run([str(python), "-m", "pip", "install", "-q", FLINK], check=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(f"pip install {FLINK} took more than {INSTALL_TIMEOUT_S} s; check the network and "
                         f"run again (it resumes from a fresh venv)") from exc
    marker.write_text(FLINK)
    return python


def _csv_mirror(landing: Path, work: Path) -> Path:
    """The landing Parquet files as headerless CSV (event_time, user_id, page, duration_ms), once."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    out = work / "flink-csv"
    sources = sorted(landing.rglob("*.parquet"))
    marker = out / ".mirrored"
    wanted = json.dumps([str(p) for p in sources])
    if marker.exists() and marker.read_text() == wanted:
        return out
    print(f"mirroring {len(sources)} landing files as CSV for Flink ...", flush=True)
    fresh(out).mkdir(parents=True)
    for i, path in enumerate(sources):
        table = pq.read_table(path, columns=["event_time", "user_id", "page", "duration_ms"])
        millis = pc.cast(table["event_time"], pa.timestamp("ms", "UTC"), safe=False)  # TIMESTAMP(3): truncated
        when = pc.strftime(millis, format="%Y-%m-%d %H:%M:%S")
        table = table.set_column(0, "event_time", when)
        pcsv.write_csv(table, out / f"part-{i:05d}.csv", pcsv.WriteOptions(include_header=False))
    marker.write_text(wanted)
    return out


def _counted(sink: Path) -> int:
    """Events counted by one run's result rows (their ``views`` column)."""
    import pyarrow.csv as pcsv

    events = 0
    for part in sink.rglob("*"):
        if part.is_file() and not part.name.startswith("."):
            rows = pcsv.read_csv(part, read_options=pcsv.ReadOptions(autogenerate_column_names=True))
            events += int(rows.column(VIEWS_COLUMN).to_numpy().sum()) if rows.num_rows else 0
    return events


def flink_peer(work: Path, landing: Path, *, parallelism: int, watermark_minutes: int,
               query: FlinkQuery) -> dict[str, Any]:
    """Flink's figures: the job's wall time in a fresh JVM (``job_s``) and run again in it (``warm_job_s``), the
    command's, and the events its windows counted in the run that counted fewer (a check that the watermark dropped
    none as late)."""
    python = _venv(work)
    source = _csv_mirror(landing, work)
    sink = fresh(work / f"flink-results-{query.kind}")
    env = dict(os.environ)
    print(f"Flink SQL over the same events ({query.kind} windows of {query.minutes} minutes, parallelism "
          f"{parallelism}) ...", flush=True)
    start = time.perf_counter()
    try:
        done = subprocess.run([str(python), str(Path(__file__).with_name("flink_job.py")), "--source", str(source),
                               "--sink", str(sink), "--parallelism", str(parallelism),
                               "--watermark-minutes", str(watermark_minutes), *query.args(), "--runs", "2"],
                              check=True, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, env=env)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"the Flink job failed (exit {exc.returncode}):\n{exc.stderr[-3000:]}") from exc
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(f"the Flink job took more than {JOB_TIMEOUT_S} s") from exc
    wall = time.perf_counter() - start
    times = json.loads(done.stdout.strip().splitlines()[-1])
    counted = [_counted(sink / f"run-{run}") for run in (1, 2)]
    return {"query": query.kind, "minutes": query.minutes, "job_s": times["job_s"][0], "warm_job_s": times["job_s"][1],
            "command_s": times["command_s"], "subprocess_s": wall, "events_counted": min(counted)}
