"""``python -m benchmarks airflow``: a real scheduler backfill of N days against the warm CLI.

What a user waits for is the wall time of a backfill, cold starts and orchestration included.
Both ways run in one process, on one machine, over the same landing days and one Spark Connect
server: first each day through the CLI in this warm process (validate input, combine, validate
partials, reduce, validate outputs: the batch DAG's five Spark tasks), then ``airflow backfill
create`` over the same days, executed by a real scheduler (LocalExecutor, SQLite) whose tasks
reach the server through the warm runner. Printed: each day's time both ways, the backfill's
wall time per day, and its ratio to the warm CLI day. Both lakes must hold equal aggregates.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from spark_jobs.airflow_client import AirflowClient, RunsNotFinished
from spark_jobs.errors import ComputeError, InputError
from spark_jobs.spark_session import close_remote

__all__ = ["airflow_bench"]

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "pipelines" / "page_views.yaml"
START = "2024-03-01"


def airflow_bench(args: argparse.Namespace) -> int:
    for flag, value in (("--days", args.days), ("--rows-per-day", args.rows_per_day),
                        ("--max-active-runs", args.max_active_runs), ("--parallelism", args.parallelism)):
        if value < 1:
            raise InputError(f"benchmarks airflow: {flag} must be at least 1, got {value}")
    work = Path(args.work_dir) / "airflow"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    days = [(dt.date.fromisoformat(START) + dt.timedelta(days=i)).isoformat() for i in range(args.days)]
    landing = work / "landing"
    print(f"generating {args.rows_per_day:,} events a day for {len(days)} days ...", flush=True)
    _cli("generate", "--out", str(landing), "--days", str(len(days)), "--rows-per-day", str(args.rows_per_day),
         "--start", START, "--quiet")
    cli_spec = _spec(work / "cli", landing)
    af_spec = _spec(work / "airflow_pipelines", landing)
    state = work / "state"
    env = dict(os.environ)
    port = _free_port()
    print("starting the Spark Connect server and the warm runner ...", flush=True)
    started = time.monotonic()
    _cli("server", "start", "--state-dir", str(state), "--port", str(port), "--driver-memory", args.driver_memory)
    server_start = time.monotonic() - started
    try:
        os.environ["SPARK_REMOTE"] = f"sc://127.0.0.1:{port}"
        print("warm-up, not counted: the first day once, into a lake of its own", flush=True)
        _warm_cli(_spec(work / "warmup", landing), days[:1])
        cli_days = _warm_cli(cli_spec, days)
        close_remote()  # while the server still answers
        af_runs, af_wall = _backfill(work, af_spec, days, state, args)
    finally:
        _cli("server", "stop", "--state-dir", str(state))
        os.environ.clear()
        os.environ.update(env)
    _same_aggregates(cli_spec, af_spec)
    return _report(days, cli_days, af_runs, af_wall, server_start, args)


def _cli(*argv: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "spark_jobs", *argv], text=True, capture_output=True, timeout=600)
    if proc.returncode != 0:
        raise ComputeError(f"spark_jobs {' '.join(argv[:2])} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def _spec(folder: Path, landing: Path) -> Path:
    """The sample spec with the bench's landing folder and a lake of its own."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(SAMPLE.read_text())
    raw["source"]["path"] = str(landing)
    raw["lake"] = str(folder / "lake")
    path = folder / "page_views.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _warm_cli(spec: Path, days: list[str]) -> list[float]:
    """Each day's five Spark commands in this process: one Connect session kept warm, imports done once."""
    from spark_jobs.__main__ import main

    out = []
    for day in days:
        started = time.monotonic()
        for command in (["validate", "--suite", "input", "--date", day], ["combine", "--date", day],
                        ["validate", "--suite", "outputs", "--date", day], ["reduce"],
                        ["validate", "--suite", "outputs"]):
            with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
                code = main([*command, "--pipeline", str(spec)], keep_session=True)
            if code != 0:
                raise ComputeError(f"warm CLI: {' '.join(command)} of {day} exited {code}")
        out.append(time.monotonic() - started)
        print(f"  warm CLI {day}: {out[-1]:.1f} s", flush=True)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _airflow_env(home: Path, pipelines: Path, state: Path, last_day: str, parallelism: int) -> dict[str, str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "SPARK_JOBS_PIPELINES": str(pipelines),
        "SPARK_JOBS_END_DATE": last_day,
        "SPARK_REMOTE": os.environ["SPARK_REMOTE"],
        "SPARK_JOBS_RUNNER": str(state / "runner.sock"),
        "GX_ANALYTICS_ENABLED": "False",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    return env


def _airflow(env: dict[str, str], *argv: str, timeout: float = 300) -> str:
    for attempt in range(5):  # SQLite answers "database is locked" now and then under a running scheduler
        proc = subprocess.run([str(Path(sys.executable).parent / "airflow"), *argv], env=env, text=True,
                              capture_output=True, timeout=timeout)
        if proc.returncode == 0:
            return proc.stdout
        time.sleep(1 + attempt)
    raise ComputeError(f"airflow {' '.join(argv)} failed:\n{proc.stderr[-3000:]}")


@contextlib.contextmanager
def _running(env: dict[str, str], home: Path) -> Iterator[None]:
    procs = []
    try:
        for component in (["api-server", "--port", env["AIRFLOW__API__PORT"], "--workers", "1"], ["scheduler"],
                          ["dag-processor"]):
            log = (home / f"{component[0]}.log").open("wb")
            procs.append(subprocess.Popen([str(Path(sys.executable).parent / "airflow"), *component], env=env,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _backfill(work: Path, spec: Path, days: list[str], state: Path,
              args: argparse.Namespace) -> tuple[list[dict[str, Any]], float]:
    home = work / "airflow_home"
    home.mkdir()
    password = secrets.token_urlsafe(12)
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    env = _airflow_env(home, spec.parent, state, days[-1], args.parallelism)
    _airflow(env, "db", "migrate")
    _airflow(env, "pools", "set", "aggregates_page_views", "1", "writers of page_views.aggregates")
    _airflow(env, "dags", "reserialize")
    _airflow(env, "dags", "pause", "page_views_batch")
    _airflow(env, "backfill", "create", "--dag-id", "page_views_batch", "--from-date", days[0], "--to-date", days[-1],
             "--max-active-runs", str(args.max_active_runs))
    print(f"airflow backfill of {len(days)} days (max {args.max_active_runs} runs at once) ...", flush=True)
    with _running(env, home):
        deadline = time.monotonic() + args.timeout
        while True:  # the API server the tasks report to must be up before the runs start
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", int(env["AIRFLOW__API__PORT"])),
                                                                        timeout=1):
                break
            if time.monotonic() > deadline:
                raise ComputeError(f"the Airflow API server did not start; see {home}/api-server.log")
            time.sleep(1)
        client = AirflowClient(env["AIRFLOW__API__BASE_URL"], "admin", password)
        client.set_paused("page_views_batch", False)
        unpaused = time.monotonic()
        try:
            runs = client.wait("page_views_batch", runs=len(days), prefix="backfill__",
                               timeout=max(1.0, deadline - time.monotonic()), on_change=_progress(len(days)))
        except RunsNotFinished as exc:
            raise ComputeError(f"{exc}; see {home}/scheduler.log") from exc
        wall = time.monotonic() - unpaused
    failed = [r["dag_run_id"] for r in runs if r["state"] != "success"]
    if failed:
        raise ComputeError(f"backfill runs failed: {failed}; see the task logs under {home}/logs")
    return runs, wall


def _progress(total: int) -> Callable[[str], None]:
    started = time.monotonic()

    def show(line: str) -> None:
        done = line.count(" success") + line.count(" failed")
        print(f"  {time.monotonic() - started:5.0f} s: {done}/{total} runs finished", flush=True)

    return show


def _same_aggregates(a: Path, b: Path) -> None:
    """The backfill and the warm CLI must have produced the same serving table."""
    from spark_jobs.lake import PipelineTables
    from spark_jobs.lake.reader import open_table
    from spark_jobs.spec import load_spec

    def values(path: Path) -> list[tuple[Any, ...]]:
        spec = load_spec(path)
        cols = [*spec.key_columns, "views", "total_ms", "max_ms"]
        rows = open_table(PipelineTables(spec.lake, spec.name).aggregates).read(cols).to_pylist()
        return sorted(tuple(r[c] for c in cols) for r in rows)

    if values(a) != values(b):
        raise ComputeError("the backfill's aggregates differ from the warm CLI's: a bug, not a benchmark result")


def _seconds(run: dict[str, Any]) -> float:
    start, end = (dt.datetime.fromisoformat(run[k]) for k in ("start_date", "end_date"))
    return (end - start).total_seconds()


def _report(days: list[str], cli: list[float], runs: list[dict[str, Any]], wall: float, server_start: float,
            args: argparse.Namespace) -> int:
    by_day = {r["logical_date"][:10]: _seconds(r) for r in runs}
    print(f"\n{'day':<12}{'warm CLI s':>12}{'Airflow run s':>15}")
    for day, seconds in zip(days, cli, strict=True):
        print(f"{day:<12}{seconds:>12.1f}{by_day[day]:>15.1f}")
    cli_day = statistics.mean(cli)
    af_day = wall / len(days)
    figures = {"days": len(days), "rows_per_day": args.rows_per_day, "cores": os.cpu_count(),
               "max_active_runs": args.max_active_runs, "server_start_s": round(server_start, 1),
               "warm_cli_day_s": round(cli_day, 2), "backfill_wall_s": round(wall, 1),
               "backfill_day_s": round(af_day, 2), "ratio": round(af_day / cli_day, 2),
               "airflow_run_s_median": round(statistics.median(by_day.values()), 1)}
    print(f"\nwarm CLI day (mean): {cli_day:.1f} s; backfill wall {wall:.0f} s for {len(days)} days = "
          f"{af_day:.1f} s a day ({figures['ratio']:.2f}x the warm CLI day, target <= 3x); "
          f"server start {server_start:.1f} s, once")
    print(json.dumps(figures))
    return 0
