"""Shared fixtures: one SparkSession for the whole run, small data, real Delta tables."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
os.environ.setdefault("SPARK_JOBS_DELTA_BACKEND", "embedded")
os.environ.setdefault("SPARK_JOBS_UI", "false")  # no Spark UI (and its port) per test job
logging.getLogger("py4j").setLevel(logging.ERROR)  # py4j logs to a closed stream at interpreter exit


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.session import SessionConfig, build_session

    session = build_session(SessionConfig(master="local[2]", shuffle_partitions=2, app_name="spark_jobs tests",
                                          driver_memory="2g"))
    yield session
    session.stop()


@dataclass(frozen=True)
class SparkServer:
    """The session's Spark Connect server and warm runner (``python -m spark_jobs server start``)."""

    remote: str
    runner: str
    state_dir: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "SPARK_REMOTE": self.remote, "SPARK_JOBS_RUNNER": self.runner}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def spark_server():
    """One real Spark Connect server and runner for every test that needs them, started on first use."""
    state = Path(tempfile.mkdtemp(prefix="sj-"))  # short: the runner's socket path must fit in 108 bytes
    port = free_port()
    command = [sys.executable, "-m", "spark_jobs", "server"]
    proc = subprocess.run([*command, "start", "--state-dir", str(state), "--port", str(port), "--master", "local[2]",
                           "--driver-memory", "1g", "--shuffle-partitions", "2"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"server start failed:\n{proc.stdout}\n{proc.stderr}"
    yield SparkServer(f"sc://127.0.0.1:{port}", str(state / "runner.sock"), state)
    subprocess.run([*command, "stop", "--state-dir", str(state)], capture_output=True, timeout=120, check=False)
    shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def standalone_cluster():
    """A real Spark standalone cluster: a master and two 1-core workers from the venv's pyspark, on 127.0.0.1."""
    from spark_jobs.server.standalone import Standalone

    state = Path(tempfile.mkdtemp(prefix="sj-cluster-"))
    cluster = Standalone(state, workers=2, cores=1, memory="1g", port=free_port(), ui_port=free_port())
    cluster.start(timeout=180)
    yield cluster
    cluster.stop()
    shutil.rmtree(state, ignore_errors=True)
