"""How a session follows the cluster: shuffle partitions from its cores, executor settings, the UI."""

from __future__ import annotations

import pytest

from spark_jobs.errors import UsageError
from spark_jobs.server.connect import ConnectServer
from spark_jobs.spark_session import CLUSTER_SHUFFLE_PARTITIONS, SessionConfig, server_conf, shuffle_partitions_for


@pytest.mark.parametrize(("cores", "partitions"), [(1, 8), (2, 8), (4, 8), (5, 10), (64, 128)])
def test_shuffle_partitions_follow_the_clusters_cores_with_a_floor(cores, partitions):
    assert shuffle_partitions_for(cores) == partitions


def test_executor_settings_reach_the_application_and_a_flag_wins_over_the_default(monkeypatch):
    monkeypatch.setenv("SPARK_EXECUTOR_MEMORY", "3g")
    conf = server_conf(SessionConfig(master="spark://h:7077", remote=None, executor_cores=2, shuffle_partitions=16))
    assert conf["spark.executor.cores"] == "2" and conf["spark.executor.memory"] == "3g"
    assert conf["spark.sql.shuffle.partitions"] == "16"
    assert "spark.executor.cores" not in server_conf(SessionConfig(remote=None))


def test_the_ui_is_on_unless_turned_off(monkeypatch):
    monkeypatch.delenv("SPARK_JOBS_UI", raising=False)
    assert SessionConfig(remote=None).ui
    monkeypatch.setenv("SPARK_JOBS_UI", "false")
    assert not SessionConfig(remote=None).ui


@pytest.mark.parametrize("env", [{"SPARK_EXECUTOR_CORES": "two"}, {"SPARK_EXECUTOR_CORES": "0"}])
def test_bad_executor_cores_are_a_usage_error(monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UsageError, match=r"executor cores|SPARK_EXECUTOR_CORES"):
        SessionConfig(remote=None)


@pytest.mark.parametrize(("master", "partitions"), [
    ("local[2]", 8), ("local[16]", 32), ("local[16, 3]", 32), ("local", 8),
    ("spark://h:7077", CLUSTER_SHUFFLE_PARTITIONS), ("yarn", CLUSTER_SHUFFLE_PARTITIONS),
])
def test_an_application_starts_with_partitions_that_follow_its_master(master, partitions):
    conf = server_conf(SessionConfig(master=master, remote=None))
    assert conf["spark.sql.shuffle.partitions"] == str(partitions)
    assert conf["spark.sql.adaptive.coalescePartitions.enabled"] == "true"  # a cluster's 200 shrink to its cores


def test_the_connect_server_follows_its_master_unless_told(tmp_path):
    def partitions(server: ConnectServer) -> str:
        cmd = server.command()
        return next(c.split("=", 1)[1] for c in cmd if c.startswith("spark.sql.shuffle.partitions="))

    assert partitions(ConnectServer(tmp_path, master="local[16]")) == "32"
    assert partitions(ConnectServer(tmp_path, master="spark://h:7077")) == str(CLUSTER_SHUFFLE_PARTITIONS)
    assert partitions(ConnectServer(tmp_path, master="local[16]", shuffle_partitions=5)) == "5"
