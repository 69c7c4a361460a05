"""How a session follows the cluster: shuffle partitions from its cores, executor settings, the UI."""

from __future__ import annotations

import pytest

from spark_jobs.errors import UsageError
from spark_jobs.session import SessionConfig, server_conf, shuffle_partitions_for


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
