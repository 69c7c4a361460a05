"""Shared fixtures: one SparkSession for the whole run, small data, real Delta tables."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import connect_server, free_port, interpreted_spark, quick_jvm, steady_jvm

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
os.environ.setdefault("SPARK_JOBS_DELTA_BACKEND", "embedded")
os.environ.setdefault("SPARK_JOBS_UI", "false")  # no Spark UI (and its port) per test job
logging.getLogger("py4j").setLevel(logging.ERROR)  # py4j logs to a closed stream at interpreter exit
# Short-lived JVMs (the CLI's and Airflow's jobs, the cluster's) start on C1 only; the two that live as long as the
# suite (its SparkSession, the Connect server) keep C2: two in-process stream tests took 196 s so, 240 s on C1.
os.environ.update(interpreted_spark(quick_jvm(os.environ)))


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.spark_session import SessionConfig, build_session

    with steady_jvm():
        session = build_session(SessionConfig(master="local[2]", shuffle_partitions=2, app_name="spark_jobs tests",
                                              driver_memory="2g"))
    yield session
    session.stop()


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
