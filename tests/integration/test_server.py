"""The spark_jobs server for real: a Spark Connect server and the warm runner, as Airflow tasks use them.

Jobs run in the runner (a fork of a pre-imported Python) as Connect clients: never in this pytest
process, whose classic SparkSession a Connect session would turn remote.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from deltalake import DeltaTable

from spark_jobs.errors import ComputeError
from spark_jobs.lake import PipelineTables
from spark_jobs.server.runner import run_job
from tests.builders import day_events, make_spec, write_day
from tests.helpers import free_port
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.slow

DAYS = ("2024-03-01", "2024-03-02")


def run(server, argv: list[str], cwd: Path | None = None) -> tuple[int, list[str]]:
    lines: list[str] = []
    code = run_job(server.runner, argv, env=server.env(), cwd=str(cwd) if cwd else None, on_line=lines.append)
    return code, lines


def test_a_day_through_connect_gates_combine_reduce_equals_the_oracle(spark_server, tmp_path):
    # every aggregate, the vectorised UDAF (mapInArrow on the server's Python workers) included
    spec = make_spec(tmp_path, window={"size": "1 hour"})
    for i, day in enumerate(DAYS):
        write_day(tmp_path / "landing", day, day_events(day, 400, seed=i, rejected=3), files=2)
    for day in DAYS:
        for argv in (["validate", "--suite", "input", "--date", day], ["combine", "--date", day],
                     ["validate", "--suite", "outputs", "--date", day], ["reduce"], ["validate", "--suite", "outputs"]):
            code, lines = run(spark_server, [*argv, "--pipeline", spec.origin])
            assert code == 0, "\n".join(lines[-30:])
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(tmp_path / "landing"), spec), spec)
    dead = DeltaTable(tables.dead_letter).to_pyarrow_table().to_pylist()
    assert len(dead) == 6 and {d["job"] for d in dead} == {"combine"}
    report = json.loads((Path(spec.lake) / "views" / "_quality" / "outputs" / "all" / "latest.json").read_text())
    assert report["success"] is True


def test_the_runner_runs_each_job_in_the_requests_directory_and_environment(spark_server, tmp_path):
    code, lines = run(spark_server, ["generate", "--out", "here/landing", "--days", "1", "--rows-per-day", "50",
                                     "--quiet"], cwd=tmp_path)
    assert code == 0, lines
    assert (tmp_path / "here" / "landing" / "event_date=2024-03-01").is_dir()
    assert any(line.startswith("wrote 50 events") for line in lines)


def test_the_runner_passes_on_the_jobs_error_and_exit_code(spark_server, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad-Name\nsource: {path: x, format: parquet, event_time: t, schema: {t: timestamp}}\n"
                   "aggregates: [{name: n, fn: medain}]\nlake: lake\n")
    code, lines = run(spark_server, ["combine", "--pipeline", str(bad), "--date", "2024-03-01"])
    assert code == 2
    assert "aggregates[0].fn: unknown function 'medain'" in "\n".join(lines)
    code, lines = run(spark_server, ["combine", "--pipeline", str(bad)])
    assert code == 2 and "the following arguments are required: --date" in "\n".join(lines)  # argparse's own exit


def test_a_client_that_goes_away_stops_its_job(spark_server, tmp_path):
    runner_pid = int((spark_server.state_dir / "runner.pid").read_text())
    before = {p.pid for p in psutil.Process(runner_pid).children()}
    conns, errors = [], []

    def client() -> None:
        try:
            run_job(spark_server.runner, ["generate", "--out", str(tmp_path / "big"), "--days", "30", "--rows-per-day",
                                          "2000000", "--quiet"], env=spark_server.env(), on_line=lambda _: None,
                    on_start=conns.append)
        except ComputeError as exc:  # the client's side of the connection it closed
            errors.append(str(exc))

    job = threading.Thread(target=client, daemon=True)
    job.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not ({p.pid for p in psutil.Process(runner_pid).children()} - before):
        time.sleep(0.1)
    [child] = {p.pid for p in psutil.Process(runner_pid).children()} - before
    conns[0].shutdown(2)  # what SparkJobOperator.on_kill does
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and psutil.pid_exists(child) and psutil.Process(child).status() != "zombie":
        time.sleep(0.1)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"
    job.join(timeout=30)
    assert len(errors) == 1 and "closed the connection before the job ended" in errors[0]


def test_a_server_that_is_down_fails_the_job_at_once_naming_the_fix(tmp_path):
    spec = make_spec(tmp_path)
    address = f"sc://127.0.0.1:{free_port()}"
    proc = subprocess.run([sys.executable, "-m", "spark_jobs", "reduce", "--pipeline", spec.origin, "--remote", address],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 6, proc.stderr
    assert f"error: no Spark Connect server answers at {address}" in proc.stderr
    assert "python -m spark_jobs server start" in proc.stderr and "Traceback" not in proc.stderr


def test_server_status_says_down_and_bad_options_are_refused(tmp_path):
    state = tmp_path / "state"
    cmd = [sys.executable, "-m", "spark_jobs", "server"]
    proc = subprocess.run([*cmd, "status", "--state-dir", str(state), "--port", str(free_port())],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1 and "Connect server: down" in proc.stdout
    proc = subprocess.run([*cmd, "start", "--state-dir", str(state), "--conf", "driver.memory"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "bad --conf 'driver.memory'; use --conf spark.some.key=value" in proc.stderr
    for options, message in ((["--port", "0"], "bad Spark Connect port 0 (--port); use 1-65535"),
                             (["--master", "bogus"], "bad Spark master 'bogus' (--master or $SPARK_MASTER)")):
        proc = subprocess.run([*cmd, "start", "--state-dir", str(state), *options],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 2 and f"error: {message}" in proc.stderr, proc.stderr
    assert not (state / "connect-server.pid").exists()
