"""``SparkJobOperator``: run one ``spark_jobs`` command on a shared Spark Connect server or through ``spark-submit``.

Where it runs is :func:`resolve_target`'s choice; a Connect client job runs in the warm job runner at
``$SPARK_JOBS_RUNNER`` when one answers (no Python start, no imports). A non-zero exit fails the task with the job's
own error message and exit code; exit codes a retry cannot fix (2: bad spec or arguments, 5: a failed quality gate)
without retries.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

import spark_jobs

if TYPE_CHECKING:
    from airflow.sdk import Connection

__all__ = ["DATE", "NO_RETRY_EXIT_CODES", "SparkJobError", "SparkJobOperator", "SparkTarget", "resolve_master",
           "resolve_target"]

# the `date` param, else the logical date, else the trigger day (a manual run has no logical date unless given one)
DATE = "{{ params.date or (dag_run.logical_date or dag_run.run_after).strftime('%Y-%m-%d') }}"
NO_RETRY_EXIT_CODES = {2: "bad spec or arguments", 5: "quality gate failed"}
# what spark-submit runs: the CLI's own file (it keeps its folder off sys.path; see spark_jobs/__main__.py)
SUBMIT_FILE = Path(spark_jobs.__file__).resolve().with_name("__main__.py")


class SparkJobError(AirflowException):
    """A spark_jobs command exited non-zero; carries its exit code and error text."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class SparkJobFailure(SparkJobError, AirflowFailException):
    """A failure a retry cannot fix: no retries."""


def _connection(conn_id: str) -> Connection | None:
    """The Airflow connection ``conn_id``, or None when it is not defined. Only that means "no connection": a
    secrets backend that fails, or an extra that is not JSON, raises, so a broken connection fails the task
    instead of silently sending the job to ``$SPARK_REMOTE`` or ``local[*]``."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:  # what Airflow 3.3's Connection.get raises for an unknown conn_id
        return None
    if conn.extra:
        try:
            json.loads(conn.extra)
        except json.JSONDecodeError as exc:  # Airflow would log it and read the extra as {}
            raise AirflowException(f"the extra of the Airflow connection {conn_id!r} is not JSON ({exc.msg} at "
                                   f"character {exc.pos}); fix it, e.g. {{\"use_ssl\": true}}") from None
    return conn


def _remote_from_connection(conn_id: str) -> str | None:
    """``sc://host:port[/;user_id=..;token=..;use_ssl=true]`` as the Spark provider's ``spark_connect`` type.

    Values are percent-quoted (a token may hold ``;``, ``/`` or ``=``): pyspark's ``DefaultChannelBuilder`` splits
    the parameters on ``;`` and ``=`` and unquotes each value (pyspark 4.2), so the server gets the token as the
    connection holds it. The quoted token is masked in the task log too (Airflow masks only the raw password).
    """
    conn = _connection(conn_id)
    if conn is None or not (host := (conn.host or "").strip().removeprefix("sc://").rstrip("/")):
        return None
    params = {"user_id": conn.login, "token": conn.password,
              "use_ssl": "true" if str(conn.extra_dejson.get("use_ssl", "")).lower() in ("1", "true") else None}
    quoted = {key: quote(value, safe="") for key, value in params.items() if value}
    if "token" in quoted:
        from airflow.sdk.log import mask_secret

        mask_secret(quoted["token"])
    url = f"sc://{host}:{conn.port or 15002}"
    return f"{url}/;{';'.join(f'{k}={v}' for k, v in quoted.items())}" if quoted else url


def _master_from_connection(conn_id: str) -> str | None:
    conn = _connection(conn_id)
    if conn is None or not (host := (conn.host or "").strip()):
        return None
    if host.startswith(("local", "yarn")):
        return host
    if "://" not in host:
        host = f"spark://{host}"
    return f"{host}:{conn.port}" if conn.port else host


def resolve_master(master: str | None = None, conn_id: str | None = "spark_default") -> str:
    """Explicit ``master``, else the Airflow connection ``conn_id``, else ``$SPARK_MASTER``, else ``local[*]``."""
    return master or (conn_id and _master_from_connection(conn_id)) or os.environ.get("SPARK_MASTER") or "local[*]"


@dataclass(frozen=True)
class SparkTarget:
    """Where a task's job runs: a Spark Connect server (``connect``) or its own application (``submit``)."""

    kind: Literal["connect", "submit"]
    url: str


def resolve_target(*, master: str | None = None, remote: str | None = None, conn_id: str | None = "spark_default",
                   connect_conn_id: str | None = "spark_connect_default") -> SparkTarget:
    """Explicit ``remote`` or ``master``; else a Connect server from ``connect_conn_id`` or ``$SPARK_REMOTE``;
    else ``spark-submit`` to :func:`resolve_master`."""
    if not (remote or master):
        remote = (connect_conn_id and _remote_from_connection(connect_conn_id)) or os.environ.get("SPARK_REMOTE")
    return SparkTarget("connect", remote) if remote else SparkTarget("submit", resolve_master(master, conn_id))


def _error_text(lines: Sequence[str]) -> str:
    """The job's own error: from its last ``error:`` line on, else its last non-empty line."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("error: "):
            return "\n".join(lines[i:])[:4000]
    return next((line[:2000] for line in reversed(lines) if line.strip()), "(no output)")


class SparkJobOperator(BaseOperator):
    """Run ``python -m spark_jobs <args>`` on the Spark Connect server, or through ``spark-submit``.

    Args:
        args: the spark_jobs command line (templated), e.g. ``["combine", "--pipeline", p, "--date", DATE]``.
        master: Spark master URL of an own application per task (``spark-submit``); wins over a Connect
            server. Default from the Airflow connection ``conn_id``, ``$SPARK_MASTER`` or ``local[*]``.
        remote: Connect server ``sc://host:port``; default from the connection ``connect_conn_id``, ``$SPARK_REMOTE``.
        conn_id: Airflow connection holding the master (host ``spark://h``, port 7077), if defined.
        connect_conn_id: Airflow connection of the Connect server (type ``spark_connect``: host, port,
            login as user_id, password as token, extra ``{"use_ssl": true}``), if defined.
        driver_memory: ``--driver-memory`` of the job's driver.
        skip_if: called with the context before submitting; a returned reason skips the task.
    """

    template_fields: Sequence[str] = ("args",)
    ui_color = "#f4a460"

    def __init__(self, *, args: Sequence[str], master: str | None = None, remote: str | None = None,
                 conn_id: str | None = "spark_default", connect_conn_id: str | None = "spark_connect_default",
                 driver_memory: str = "1g", skip_if: Callable[[Any], str | None] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.args = list(args)
        self.master, self.remote, self.conn_id, self.connect_conn_id = master, remote, conn_id, connect_conn_id
        self.driver_memory, self.skip_if = driver_memory, skip_if
        self._proc: subprocess.Popen[str] | None = None
        self._runner_conn: socket.socket | None = None

    def command(self, master: str) -> list[str]:
        submit = shutil.which("spark-submit") or str(Path(sys.executable).parent / "spark-submit")
        return [submit, "--master", master, "--driver-memory", self.driver_memory, "--name",
                f"spark_jobs {self.args[0] if self.args else ''}".strip(), "--conf", "spark.log.level=WARN",
                str(SUBMIT_FILE), *map(str, self.args)]

    def environment(self, target: SparkTarget) -> dict[str, str]:
        from spark_jobs.spark_session import ensure_java_home

        ensure_java_home()
        env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
        env["SPARK_REMOTE" if target.kind == "connect" else "SPARK_MASTER"] = target.url
        env.update({"SPARK_DRIVER_MEMORY": self.driver_memory,
                    "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
                    "PYSPARK_DRIVER_PYTHON": env.get("PYSPARK_DRIVER_PYTHON", sys.executable),
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", "PYTHONUNBUFFERED": "1",
                    "GX_ANALYTICS_ENABLED": "False"})
        return env

    def execute(self, context: Any) -> str | None:
        if self.skip_if is not None and (reason := self.skip_if(context)):
            raise AirflowSkipException(reason)
        target = resolve_target(master=self.master, remote=self.remote, conn_id=self.conn_id,
                                connect_conn_id=self.connect_conn_id)
        tail: collections.deque[str] = collections.deque(maxlen=200)

        def line(text: str) -> None:
            tail.append(text)
            self.log.info("%s", text)

        if (code := self._run(target, self.environment(target), line)) != 0:
            message = f"spark_jobs {self.args[0] if self.args else ''} failed with exit code {code}: {_error_text(list(tail))}"
            if code in NO_RETRY_EXIT_CODES:
                raise SparkJobFailure(f"{message}\n(no retry: {NO_RETRY_EXIT_CODES[code]})", code)
            raise SparkJobError(message, code)
        summary = [line for line in tail if line.strip() and not line.startswith(("WARN", "Using Spark", "Setting"))]
        return summary[-1] if summary else None

    def _run(self, target: SparkTarget, env: dict[str, str], line: Callable[[str], None]) -> int:
        """The job's exit code: run in the warm runner at ``$SPARK_JOBS_RUNNER`` when the target is a Connect
        server and the runner answers, else in a process of its own; each line of its output goes to ``line``."""
        runner = os.environ.get("SPARK_JOBS_RUNNER")
        if target.kind == "connect" and runner:
            from spark_jobs.server.runner import probe, run_job

            if probe(runner):
                self.log.info("running on %s, in the warm runner %s: spark_jobs %s", target.url, runner,
                              " ".join(map(str, self.args)))
                return run_job(runner, list(map(str, self.args)), env=env, on_line=line,
                               on_start=lambda conn: setattr(self, "_runner_conn", conn))
            self.log.warning("no warm runner answers at %s (SPARK_JOBS_RUNNER); starting a Python for the job", runner)
        cmd = (self.command(target.url) if target.kind == "submit"
               else [sys.executable, "-m", "spark_jobs", *map(str, self.args)])
        self.log.info("running%s: %s", f" on {target.url}" if target.kind == "connect" else "", " ".join(cmd))
        self._proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      bufsize=1, start_new_session=True)
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            line(raw.rstrip("\n"))
        return self._proc.wait()

    def on_kill(self) -> None:
        if self._runner_conn is not None:  # the runner stops the job when its client goes away
            with contextlib.suppress(OSError):
                self._runner_conn.shutdown(socket.SHUT_RDWR)
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
