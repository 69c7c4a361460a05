"""Run real Airflow 3 from tests: an isolated AIRFLOW_HOME, the repo's dags/ and plugins/, the CLI.

Each test gets its own home (SQLite), its own pipelines folder (``SPARK_JOBS_PIPELINES``) and
its own lake; background processes start in their own session and are stopped by process group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
AIRFLOW = str(VENV_BIN / "airflow")
TERMINAL = {"success", "failed"}


@dataclass
class AirflowHome:
    home: Path
    pipelines: Path
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False, cwd=str(ROOT))
        if check and proc.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                                 f"{proc.stderr[-5000:]}")
        return proc

    def json(self, *args: str) -> Any:
        for attempt in range(5):  # SQLite can answer "database is locked" under concurrent writers
            proc = self.run(*args, "-o", "json", check=False)
            if proc.returncode == 0:
                text = proc.stdout.strip()
                start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=0)
                return json.loads(text[start:] or "[]")
            time.sleep(1 + attempt)
        raise AssertionError(f"airflow {' '.join(args)} failed:\n{proc.stderr[-3000:]}")

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return self.json("dags", "list-runs", dag_id)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        return {t["task_id"]: t["state"] for t in self.json("tasks", "states-for-dag-run", dag_id, run_id)}

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
                _stop(p)

    def log(self, name: str) -> str:
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def airflow_home(tmp: Path, pipelines: Path) -> AirflowHome:
    """A migrated SQLite Airflow home that parses the repo's dags/ over the specs in ``pipelines``."""
    home = tmp / "airflow_home"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "SPARK_JOBS_PIPELINES": str(pipelines),
        "SPARK_JOBS_DELTA_BACKEND": "embedded",
        "SPARK_DRIVER_MEMORY": "1g",
        "GX_ANALYTICS_ENABLED": "False",
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    af = AirflowHome(home, pipelines, env)
    af.run("db", "migrate", timeout=300)
    return af


def wait_for_runs(af: AirflowHome, dag_id: str, n: int, timeout: float) -> list[dict[str, Any]]:
    """Poll until ``n`` runs of ``dag_id`` exist and all are finished; return them."""
    deadline = time.monotonic() + timeout
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = af.runs(dag_id)
        if len(runs) >= n and all(r["state"] in TERMINAL for r in runs):
            return runs
        time.sleep(5)
    raise AssertionError(f"{dag_id}: runs not finished after {timeout}s: {[(r['run_id'], r['state']) for r in runs]}"
                         f"\nscheduler log:\n{af.log('scheduler')}")
