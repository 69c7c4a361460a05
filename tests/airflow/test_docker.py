"""The compose file is valid (``docker-compose config``); no Docker engine is needed or used.

Without ``docker-compose`` the test skips, saying how to install it, unless
``SPARK_JOBS_REQUIRE_DOCKER_COMPOSE=1`` (set by ``.ci/run``, which installs it), in which case it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.airflow.harness import ROOT
from tests.builders import make_spec

COMPOSE = ROOT / "docker" / "docker-compose.yaml"


def test_the_compose_file_is_valid_and_wires_airflow_to_the_spark_cluster():
    tool = shutil.which("docker-compose")
    if tool is None:
        if os.environ.get("SPARK_JOBS_REQUIRE_DOCKER_COMPOSE") == "1":
            pytest.fail("docker-compose is required here (SPARK_JOBS_REQUIRE_DOCKER_COMPOSE=1) and missing")
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    proc = subprocess.run([tool, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    services = config["services"]
    assert {"postgres", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
            "spark-master", "spark-worker-1", "spark-worker-2", "spark-connect"} <= set(services)
    env = services["airflow-scheduler"]["environment"]
    assert '"spark://spark-master"' in env["AIRFLOW_CONN_SPARK_DEFAULT"]
    assert '"host": "spark-connect", "port": 15002' in env["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"]
    connect = services["spark-connect"]["command"]
    assert connect[:4] == ["python", "-m", "spark_jobs", "server"] and "run" in connect
    assert "spark://spark-master:7077" in connect
    for name in ("airflow-scheduler", "spark-connect", "spark-worker-1", "spark-worker-2"):
        mounts = [v.get("target") if isinstance(v, dict) else str(v).split(":")[1] for v in services[name]["volumes"]]
        assert "/data" in mounts, name  # the shared lake


def test_the_init_step_creates_each_pipelines_pool_from_the_specs_folder_the_dags_read():
    config = yaml.safe_load(COMPOSE.read_text())
    services = config["services"]
    script = "\n".join(services["airflow-init"]["command"])
    folder = services["airflow-scheduler"]["environment"]["SPARK_JOBS_PIPELINES"]
    assert f"python -m spark_jobs_airflow.pipelines {folder}" in script
    assert script.index("airflow db migrate") < script.index("spark_jobs_airflow.pipelines")
    assert script.index(f"> {folder}/page_views.yaml") < script.index("spark_jobs_airflow.pipelines")
    for name in ("airflow-scheduler", "airflow-dag-processor", "airflow-api-server", "airflow-triggerer"):
        assert services[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
    readme = (ROOT / "docker" / "README.md").read_text()
    for setting in ("spark_connect_default", "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT", "aggregates_<name>",
                    "spark_jobs_airflow.pipelines", "SPARK_JOBS_PIPELINES", "spark://spark-master:7077", "15002"):
        assert setting in readme, setting
    assert "15002" in str(services["spark-connect"]["command"])


def test_the_pools_command_refuses_a_missing_folder(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "spark_jobs_airflow.pipelines", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "plugins")})
    assert proc.returncode == 2 and "usage: python -m spark_jobs_airflow.pipelines FOLDER" in proc.stderr


def test_the_pools_command_says_when_airflow_cannot_set_them(tmp_path):
    make_spec(tmp_path, name="clicks")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins"), "PATH": "/nonexistent"}  # no airflow CLI
    proc = subprocess.run([sys.executable, "-m", "spark_jobs_airflow.pipelines", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False, env=env)
    assert proc.returncode == 1 and "error: `airflow pools set` failed" in proc.stderr
    assert "Traceback" not in proc.stderr
