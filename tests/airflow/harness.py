"""Run real Airflow 3 from tests: an isolated AIRFLOW_HOME, the repo's dags/ and plugins/, the CLI.

Each test gets its own home (SQLite), its own pipelines folder (``SPARK_JOBS_PIPELINES``) and
its own lake; background processes start in their own session and are stopped by process group.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import ROOT, VENV_BIN, free_port, stop_process

__all__ = ["AIRFLOW", "ROOT", "AirflowHome", "airflow_env", "airflow_home", "running_airflow", "wait_for_runs",
           "wait_healthy"]

AIRFLOW = str(VENV_BIN / "airflow")
TERMINAL = {"success", "failed"}


@dataclass
class AirflowHome:
    home: Path
    pipelines: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = 8080

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False, cwd=str(ROOT))
        if check and proc.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                                 f"{proc.stderr[-5000:]}")
        return proc

    def retry(self, *args: str, attempts: int = 5) -> subprocess.CompletedProcess[str]:
        """Run a CLI command that writes, again after SQLite's "database is locked" under a running scheduler."""
        for attempt in range(attempts):
            proc = self.run(*args, check=attempt == attempts - 1)
            if proc.returncode == 0:
                break
            time.sleep(1 + attempt)
        return proc

    def import_errors(self) -> list[dict[str, Any]]:
        """The import errors the dag-processor recorded (the CLI exits 1 when there are any)."""
        proc = self.run("dags", "list-import-errors", "-o", "json", check=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith(("[{", "[]"))]
        if not lines:
            raise AssertionError(f"airflow dags list-import-errors printed no JSON:\n{proc.stderr[-3000:]}")
        return list(json.loads(lines[-1]))

    def query(self, sql: str, *params: str) -> list[dict[str, Any]]:
        """Rows of the metadata database (SQLite), read without the CLI: an ``airflow dags list-runs`` or ``tasks
        states-for-dag-run`` costs 4-6 s of CPU, which the scheduler and the tasks beside it wait for."""
        db = sqlite3.connect(f"file:{self.home / 'airflow.db'}?mode=ro", uri=True, timeout=30)
        db.row_factory = sqlite3.Row
        try:
            return [dict(row) for row in db.execute(sql, params)]
        finally:
            db.close()

    def runs(self, dag_id: str, run_id_like: str = "%") -> list[dict[str, Any]]:
        """The DAG's runs (``run_id``, ``state``, ``logical_date``), in logical date order."""
        return self.query("SELECT run_id, state, logical_date FROM dag_run WHERE dag_id = ? AND run_id LIKE ? "
                          "ORDER BY logical_date", dag_id, run_id_like)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return self.query("SELECT task_id, state, start_date, end_date FROM task_instance WHERE dag_id = ? AND "
                          "run_id = ?", dag_id, run_id)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        return {t["task_id"]: t["state"] for t in self.task_instances(dag_id, run_id)}

    @contextmanager
    def background(self, *commands: list[str]) -> Iterator[list[subprocess.Popen[bytes]]]:
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for cmd in commands:
                log = (self.home / f"{cmd[0]}.log").open("wb")
                procs.append(subprocess.Popen([AIRFLOW, *cmd], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True, cwd=str(ROOT)))
            yield procs
        finally:
            for p in procs:
                stop_process(p)

    def log(self, name: str) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else ""


def airflow_env(home: Path, *, dags: Path, port: int, **settings: str) -> dict[str, str]:
    """The environment of an isolated Airflow: home, DAGs folder, this repo's plugins, no examples, its own JWT
    secret and API port; none of the caller's ``AIRFLOW*`` settings; ``settings`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    env.update(settings)
    return env


def wait_healthy(port: int, *, timeout: float, log: Callable[[], str],
                 proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll the API server's health endpoint until it answers 200; fail with its log if it exits or times out."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"airflow api-server exited with {proc.returncode}:\n{log()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"airflow api-server not healthy after {timeout:.0f} s:\n{log()}")
        time.sleep(1)


@contextmanager
def running_airflow(af: AirflowHome, timeout: float = 240) -> Iterator[None]:
    """api-server (the execution API the tasks report to), scheduler and dag-processor, until the block ends."""
    with af.background(["api-server", "--port", str(af.port), "--workers", "1"], ["scheduler"],
                       ["dag-processor"]) as procs:
        wait_healthy(af.port, timeout=timeout, log=lambda: af.log("api-server"), proc=procs[0])
        yield


def airflow_home(tmp: Path, pipelines: Path, server: Any = None) -> AirflowHome:
    """A migrated SQLite Airflow home that parses the repo's dags/ over the specs in ``pipelines``.

    With ``server`` (the ``spark_server`` fixture) tasks run on its Spark Connect server, in its warm
    runner; without, each task is a ``spark-submit``.
    """
    home = tmp / "airflow_home"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = airflow_env(home, dags=ROOT / "dags", port=port, **{
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        # task processes reach Airflow through the API server's execution API
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "SPARK_JOBS_PIPELINES": str(pipelines),
        "SPARK_JOBS_END_DATE": "2024-03-31",  # no scheduled run for a day the test has no data for
        "SPARK_JOBS_DELTA_BACKEND": "embedded",
        "SPARK_DRIVER_MEMORY": "1g",
        "GX_ANALYTICS_ENABLED": "False",
    })
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_JOBS_RUNNER", None)
    if server is not None:
        env.update({"SPARK_REMOTE": server.remote, "SPARK_JOBS_RUNNER": server.runner})
    sys.path.insert(0, str(ROOT / "plugins"))  # as Airflow does
    from spark_jobs_airflow.pipelines import load_specs

    shutil.copyfile(_migrated_database(load_specs(pipelines)[0]), home / "airflow.db")
    return AirflowHome(home, pipelines, env, port)


_DATABASES: dict[tuple[str, ...], Path] = {}


def _migrated_database(specs: Sequence[Any]) -> Path:
    """A metadata database after ``airflow db migrate`` and the pipelines' pools (as a deployment's init step makes
    them), built once per test process for each set of pipelines and copied into each home: the two cost about
    13 s of CLI starts a home."""
    from spark_jobs_airflow.pipelines import create_pools

    names = tuple(sorted(spec.name for spec in specs))
    if names not in _DATABASES:
        home = Path(tempfile.mkdtemp(prefix="airflow-db-"))
        atexit.register(shutil.rmtree, home, True)
        env = airflow_env(home, dags=ROOT / "dags", port=0)
        AirflowHome(home, home, env).run("db", "migrate", timeout=300)
        create_pools(specs, airflow=AIRFLOW, env=env)
        _DATABASES[names] = home / "airflow.db"
    return _DATABASES[names]


def wait_for_runs(af: AirflowHome, dag_id: str, n: int, timeout: float, run_type: str = "backfill"
                  ) -> list[dict[str, Any]]:
    """Wait until ``n`` runs of ``dag_id`` of ``run_type`` exist and all are finished; return them. Polls the
    metadata database every second (:meth:`AirflowHome.query`)."""
    deadline = time.monotonic() + timeout
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.OperationalError):  # locked by a writer past the busy timeout: next poll
            runs = af.runs(dag_id, f"{run_type}__%")
        if len(runs) >= n and all(r["state"] in TERMINAL for r in runs):
            return runs
        time.sleep(1)
    raise AssertionError(f"{dag_id}: runs not finished after {timeout}s: {runs}\nscheduler log:\n{af.log('scheduler')}")
