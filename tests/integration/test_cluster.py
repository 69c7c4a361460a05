"""The scale-out path on a real Spark standalone cluster (a master and two workers on this host).

Each job runs as its own application on the cluster, through Airflow (a DAG run whose Spark
connection points at the cluster) or the CLI, as a user would run it; every table must equal the
DuckDB oracle, and the work must reach both workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from spark_jobs.lake import PipelineTables
from spark_jobs.spark_session import shuffle_partitions_for
from tests.airflow.harness import airflow_home
from tests.builders import ALL_AGGREGATES, FAST_AGGREGATES, day_events, make_spec, write_day
from tests.helpers import connect_server
from tests.integration.test_stream import land, with_stream
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def driver_env(**settings: str) -> dict[str, str]:
    """The environment of a driver of the cluster: its own application (no Connect server), on 127.0.0.1."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    return {**env, "SPARK_LOCAL_IP": "127.0.0.1", **settings}


def cli(*args: str, master: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "spark_jobs", *args], cwd=REPO, env=driver_env(SPARK_MASTER=master),
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{args[0]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc


def test_a_batch_dag_run_on_a_connect_server_of_the_cluster_equals_the_oracle(standalone_cluster, tmp_path):
    """The compose file's deployment: a Spark Connect server whose application runs on the cluster, and an Airflow
    DAG run whose Spark tasks (the input gate, combine, the partials gate, reduce, the outputs gate) are its clients;
    the work runs in that one application, on executors of both workers. (Without a Connect server each task is its
    own ``spark-submit``: ``tests/airflow/test_operators.py`` runs that path.)"""
    spec = make_spec(tmp_path, window={"size": "1 hour"}, aggregates=FAST_AGGREGATES)  # the stream test has a UDAF
    write_day(tmp_path / "landing", "2024-03-01", day_events("2024-03-01", 3000, seed=1, rejected=10), files=4)
    before = len((standalone_cluster.status() or {}).get("completedapps", []))
    with connect_server(standalone_cluster.master_url, shuffle_partitions_for(2), driver_env()) as server:
        af = airflow_home(tmp_path, tmp_path, server)
        af.run("dags", "test", "views_batch", "2024-03-01", timeout=1200)
        [app] = [a for a in (standalone_cluster.status() or {}).get("activeapps", []) if "connect" in a.get("name")]
    [run] = af.runs("views_batch")
    states = af.task_states("views_batch", run["run_id"])
    assert run["state"] == "success" and set(states.values()) == {"success"}, states
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(tmp_path / "landing"), spec), spec)
    assert DeltaTable(tables.dead_letter).to_pyarrow_table().num_rows == 10
    executors = [w for w in ("worker-0", "worker-1") if (standalone_cluster.state_dir / w / app["id"]).is_dir()]
    assert executors == ["worker-0", "worker-1"]  # the server's application ran executors on both workers
    apps = (standalone_cluster.status() or {}).get("completedapps", [])
    assert [a["id"] for a in apps[before:]] == [app["id"]], apps  # and no task started an application of its own


def test_the_cluster_runs_tasks_on_both_workers(standalone_cluster, tmp_path):
    """A job's executors: one on each worker (each offers one core), and its tasks ran on both."""
    script = (
        "import socket, sys\n"
        "from spark_jobs.spark_session import SessionConfig, build_session\n"
        f"spark = build_session(SessionConfig(master={standalone_cluster.master_url!r}, driver_memory='1g'))\n"
        "sc = spark.sparkContext\n"
        "import time\n"
        "deadline = time.time() + 60\n"
        "while sc._jsc.sc().getExecutorMemoryStatus().size() < 3 and time.time() < deadline: time.sleep(0.5)\n"
        "hosts = sc.parallelize(range(64), 16).map(lambda _: __import__('os').environ.get('SPARK_WORKER_DIR') "
        "or __import__('os').getcwd()).distinct().collect()\n"
        "print('WORKDIRS', sorted(hosts))\n"
        "print('PARALLELISM', sc.defaultParallelism, spark.conf.get('spark.sql.shuffle.partitions'))\n"
        "spark.stop()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=driver_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    workdirs = next(line for line in proc.stdout.splitlines() if line.startswith("WORKDIRS"))
    state = str(standalone_cluster.state_dir)
    assert f"{state}/worker-0" in workdirs and f"{state}/worker-1" in workdirs, workdirs
    parallelism = next(line for line in proc.stdout.splitlines() if line.startswith("PARALLELISM")).split()
    assert parallelism[1:] == ["2", str(shuffle_partitions_for(2))]  # the cluster's cores, and what follows them


def test_the_stream_on_the_cluster_stops_at_a_batch_boundary_and_equals_the_oracle(standalone_cluster, tmp_path):
    spec = with_stream(make_spec(tmp_path, window={"size": "1 hour"}, aggregates=ALL_AGGREGATES),
                       max_files_per_batch=2, watermark="1 day", trigger="1 second")
    rows = day_events("2024-03-01", 3000, seed=3).sort_by("event_time")
    for i in range(4):
        land(tmp_path / "landing", "2024-03-01", rows.slice(i * 500, 500))
    master = standalone_cluster.master_url
    cli("stream", "--pipeline", spec.origin, "--available-now", master=master)
    proc = subprocess.Popen([sys.executable, "-m", "spark_jobs", "stream", "--pipeline", spec.origin], cwd=REPO,
                            env=driver_env(SPARK_MASTER=master), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        for i in range(4, 6):
            land(tmp_path / "landing", "2024-03-01", rows.slice(i * 500, 500))
        tables = PipelineTables(spec.lake, spec.name)
        deadline = time.time() + 300
        while time.time() < deadline:  # until the continuous stream has aggregated every landed row
            if sum(DeltaTable(tables.aggregates).to_pyarrow_table(columns=["views"]).column("views").to_pylist()) == 3000:
                break
            time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "stopped by signal at a batch boundary" in out
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(tmp_path / "landing"), spec), spec)
