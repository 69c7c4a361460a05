"""``SparkJobOperator``: run one ``spark_jobs`` command through ``spark-submit``.

The job's output is streamed line by line into the task log. A non-zero exit fails the task
with the job's own error message and exit code; exit codes that a retry cannot fix (2: bad
spec or arguments, 5: a failed quality gate) fail it without retries.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

__all__ = ["DATE", "NO_RETRY_EXIT_CODES", "SparkJobError", "SparkJobOperator", "resolve_master"]

# The batch date of a run: the `date` param of a manual run, else the run's logical date, else the
# day it was triggered (a manual run has no logical date unless given one).
DATE = "{{ params.date or (dag_run.logical_date or dag_run.run_after).strftime('%Y-%m-%d') }}"
NO_RETRY_EXIT_CODES = {2: "bad spec or arguments", 5: "quality gate failed"}
SUBMIT_FILE = Path(__file__).resolve().parents[2] / "spark_jobs" / "_submit" / "spark_jobs_submit.py"


class SparkJobError(AirflowException):
    """A spark_jobs command exited non-zero; carries its exit code and error text."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class SparkJobFailure(SparkJobError, AirflowFailException):
    """A failure a retry cannot fix: no retries."""


def _master_from_connection(conn_id: str) -> str | None:
    try:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(conn_id)
    except Exception:  # not defined (AirflowNotFoundException), or no Airflow metadata at all
        return None
    host = (conn.host or "").strip()
    if not host:
        return None
    if host.startswith(("local", "yarn")):
        return host
    if "://" not in host:
        host = f"spark://{host}"
    return f"{host}:{conn.port}" if conn.port else host


def resolve_master(master: str | None = None, conn_id: str | None = "spark_default") -> str:
    """Explicit ``master``, else the Airflow connection ``conn_id``, else ``$SPARK_MASTER``, else ``local[*]``."""
    if master:
        return master
    if conn_id:
        found = _master_from_connection(conn_id)
        if found:
            return found
    return os.environ.get("SPARK_MASTER") or "local[*]"


def _error_text(lines: Sequence[str]) -> str:
    """The job's own error: from its last ``error:`` line on, else its last non-empty line."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("error: "):
            return "\n".join(lines[i:])[:4000]
    tail = [line for line in lines if line.strip()]
    return tail[-1][:2000] if tail else "(no output)"


class SparkJobOperator(BaseOperator):
    """Run ``python -m spark_jobs <args>`` as ``spark-submit --master <m> spark_jobs_submit.py <args>``.

    Args:
        args: the spark_jobs command line (templated), e.g. ``["combine", "--pipeline", p, "--date", DATE]``.
        master: Spark master URL; default from the Airflow connection ``conn_id``, ``$SPARK_MASTER``
            or ``local[*]``.
        conn_id: Airflow connection holding the master (host ``spark://h``, port 7077), if defined.
        driver_memory: ``--driver-memory`` of the job's driver.
        conf: extra ``--conf`` pairs (``spark.log.level`` defaults to WARN).
        env: extra environment variables (templated).
        skip_if: called with the context before submitting; a returned reason skips the task.
    """

    template_fields: Sequence[str] = ("args", "env")
    ui_color = "#f4a460"

    def __init__(self, *, args: Sequence[str], master: str | None = None, conn_id: str | None = "spark_default",
                 driver_memory: str = "1g", conf: Mapping[str, str] | None = None,
                 env: Mapping[str, str] | None = None, skip_if: Callable[[Any], str | None] | None = None,
                 spark_submit: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.args = list(args)
        self.master = master
        self.conn_id = conn_id
        self.driver_memory = driver_memory
        self.conf = dict(conf or {})
        self.env = dict(env or {})
        self.skip_if = skip_if
        self.spark_submit = spark_submit
        self._proc: subprocess.Popen[str] | None = None

    def command(self, master: str) -> list[str]:
        submit = self.spark_submit or shutil.which("spark-submit") or str(Path(sys.executable).parent / "spark-submit")
        cmd = [submit, "--master", master, "--driver-memory", self.driver_memory, "--name",
               f"spark_jobs {self.args[0] if self.args else ''}".strip()]
        for key, value in {"spark.log.level": "WARN", **self.conf}.items():
            cmd += ["--conf", f"{key}={value}"]
        return [*cmd, str(SUBMIT_FILE), *map(str, self.args)]

    def environment(self, master: str) -> dict[str, str]:
        from spark_jobs.session import ensure_java_home

        ensure_java_home()
        env = dict(os.environ)
        venv_bin = str(Path(sys.executable).parent)
        env.update({"SPARK_MASTER": master, "SPARK_DRIVER_MEMORY": self.driver_memory,
                    "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
                    "PYSPARK_DRIVER_PYTHON": env.get("PYSPARK_DRIVER_PYTHON", sys.executable),
                    "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}", "PYTHONUNBUFFERED": "1",
                    "GX_ANALYTICS_ENABLED": "False"})
        env.update({k: str(v) for k, v in self.env.items()})
        return env

    def execute(self, context: Any) -> str | None:
        if self.skip_if is not None:
            reason = self.skip_if(context)
            if reason:
                raise AirflowSkipException(reason)
        master = resolve_master(self.master, self.conn_id)
        cmd = self.command(master)
        self.log.info("running: %s", " ".join(cmd))
        tail: collections.deque[str] = collections.deque(maxlen=200)
        self._proc = subprocess.Popen(cmd, env=self.environment(master), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.rstrip("\n")
            tail.append(line)
            self.log.info("%s", line)
        code = self._proc.wait()
        if code != 0:
            lines = list(tail)
            message = f"spark_jobs {self.args[0] if self.args else ''} failed with exit code {code}: {_error_text(lines)}"
            if code in NO_RETRY_EXIT_CODES:
                raise SparkJobFailure(f"{message}\n(no retry: {NO_RETRY_EXIT_CODES[code]})", code)
            raise SparkJobError(message, code)
        summary = [line for line in tail if line.strip() and not line.startswith(("WARN", "Using Spark", "Setting"))]
        return summary[-1] if summary else None

    def on_kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
