"""Shared fixtures: one SparkSession for the whole run, small data, real Delta tables."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import free_port, interpreted_spark, quick_jvm

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
os.environ.setdefault("SPARK_JOBS_DELTA_BACKEND", "embedded")
os.environ.setdefault("SPARK_JOBS_UI", "false")  # no Spark UI (and its port) per test job
logging.getLogger("py4j").setLevel(logging.ERROR)  # py4j logs to a closed stream at interpreter exit
# Short-lived JVMs (the CLI's and Airflow's jobs, the cluster's) start on C1 only; the two that live as long as the
# suite (its SparkSession, the Connect server) keep C2: two in-process stream tests took 196 s so, 240 s on C1.
STEADY_JAVA_OPTIONS = os.environ.get("JAVA_TOOL_OPTIONS")
os.environ.update(interpreted_spark(quick_jvm(os.environ)))


@contextlib.contextmanager
def steady_jvm():
    """``JAVA_TOOL_OPTIONS`` as it was before :func:`tests.helpers.quick_jvm`, while a long-lived JVM starts."""
    with pytest.MonkeyPatch.context() as patch:
        if STEADY_JAVA_OPTIONS is None:
            patch.delenv("JAVA_TOOL_OPTIONS")
        else:
            patch.setenv("JAVA_TOOL_OPTIONS", STEADY_JAVA_OPTIONS)
        yield


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.spark_session import SessionConfig, build_session

    with steady_jvm():
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


@contextlib.contextmanager
def connect_server(master: str = "local[2]", shuffle_partitions: int = 2, env: dict[str, str] | None = None
                   ) -> Iterator[SparkServer]:
    """A real Spark Connect server and warm runner on ``master`` (``python -m spark_jobs server start``)."""
    state = Path(tempfile.mkdtemp(prefix="sj-"))  # short: the runner's socket path must fit in 108 bytes
    port = free_port()
    command = [sys.executable, "-m", "spark_jobs", "server"]
    with steady_jvm():
        proc = subprocess.run([*command, "start", "--state-dir", str(state), "--port", str(port), "--master", master,
                               "--driver-memory", "1g", "--shuffle-partitions", str(shuffle_partitions)],
                              env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"server start failed:\n{proc.stdout}\n{proc.stderr}"
    try:
        yield SparkServer(f"sc://127.0.0.1:{port}", str(state / "runner.sock"), state)
    finally:
        subprocess.run([*command, "stop", "--state-dir", str(state)], env=env, capture_output=True, timeout=120,
                       check=False)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def spark_server():
    """One real Spark Connect server and runner for every test that needs them, started on first use."""
    with connect_server() as server:
        yield server


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


@pytest.fixture(scope="session")
def inspect_spec(spark, tmp_path_factory):
    """The spec of the small lake with history that the inspect CLI and lake view tests read
    (``tests/inspect_lake.py``), built once per session; its folder is a specs folder holding just it."""
    from tests.inspect_lake import shared_lake

    return shared_lake(spark, tmp_path_factory)


@pytest.fixture(scope="session")
def inspect_lake(inspect_spec) -> str:
    """The lake root of :func:`inspect_spec`."""
    return inspect_spec.lake


# The files that take longest (minutes: a cluster, a scheduler, kill -9 loops), longest first, by each file's summed
# test time in a fresh-clone CI run (its junit report). pytest-xdist's --dist loadfile (with --no-loadscope-reorder,
# bin/test) hands out files in collection order, so starting these first keeps one worker from being
# handed a long file at the end while the others idle (longest-processing-time-first scheduling).
LONGEST_FIRST = (
    "tests/airflow/test_batch_dag.py",
    "tests/integration/test_sessions.py",
    "tests/integration/test_stream_engines.py",
    "tests/integration/test_cluster.py",
    "tests/integration/test_stream.py",
    "tests/e2e/test_stream_recovery.py",
    "tests/e2e/test_crash_recovery.py",
    "tests/integration/test_evolution.py",
    "tests/integration/test_null_keys.py",
    "tests/integration/test_rollup_tables.py",
    "tests/airflow/test_stream_dag.py",
    "tests/integration/test_cdc_distinct.py",
    "tests/integration/test_batch_oracle.py",
    "tests/integration/test_sessions_all_rows.py",
    "tests/integration/test_server.py",
    "tests/integration/test_cumulative.py",
    "tests/integration/test_idempotence.py",
    "tests/airflow/test_quality.py",
    "tests/integration/test_changelog_fold.py",
    "tests/integration/test_peer_cases.py",
    "tests/integration/test_bad_input.py",
    "tests/e2e/test_lake_view.py",
    "tests/integration/test_peer_cases_cdc.py",
    "tests/integration/test_peer_cases_spark.py",
    "tests/integration/test_bad_files.py",
    "tests/airflow/test_maintenance.py",
    "tests/integration/test_writers_at_once.py",
    "tests/integration/test_evolution_property.py",
    "tests/integration/test_changelog_rule.py",
)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: file order kept
