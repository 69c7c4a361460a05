"""A Spark standalone cluster on one host, from the Spark that pyspark ships: a master and workers, each a
:class:`Background` process. For the tests (a real cluster where the compose file cannot start one) and for a user who
wants to try the scale-out path on one machine."""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_jobs.errors import ComputeError, UsageError
from spark_jobs.server.connect import port_open, spark_home
from spark_jobs.server.process import Background
from spark_jobs.spark_session import ensure_java_home

__all__ = ["Standalone"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


@dataclass(frozen=True)
class Standalone:
    """A master on ``host:port`` (web UI and its JSON on ``ui_port``) and ``workers`` workers."""

    state_dir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    host: str = "127.0.0.1"
    port: int = 7077
    ui_port: int = 8089

    def __post_init__(self) -> None:
        if self.workers < 1 or self.cores < 1:
            raise UsageError(f"a cluster needs at least one worker and one core each, got {self.workers} "
                             f"worker(s) of {self.cores} core(s)")

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    def _part(self, name: str) -> Background:
        return Background(name, self.state_dir)

    def status(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, applications), None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.ui_port}/json/", timeout=2) as response:
                return dict(json.load(response))
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in (self.status() or {}).get("workers", []) if w.get("state") == "ALIVE"]

    def start(self, timeout: float = 120) -> None:
        """Start the master, then the workers; return once all are registered (stop all on failure)."""
        for port in (self.port, self.ui_port):
            if port_open(self.host, port):
                raise ComputeError(f"port {port} on {self.host} is in use; stop what listens there or choose "
                                   "other ports for the cluster")
        spark_class = str(Path(spark_home()) / "bin" / "spark-class")
        ensure_java_home()
        env = {**os.environ, "SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": self.host,
               "SPARK_LOG_DIR": str(self.state_dir), "SPARK_NO_DAEMONIZE": "1"}
        try:
            self._part("master").start(
                [spark_class, MASTER_CLASS, "--host", self.host, "--port", str(self.port),
                 "--webui-port", str(self.ui_port)], env=env, ready=lambda: self.status() is not None, timeout=timeout)
            for i in range(self.workers):
                work = self.state_dir / f"worker-{i}"
                work.mkdir(parents=True, exist_ok=True)
                self._part(f"worker-{i}").start(
                    [spark_class, WORKER_CLASS, self.master_url, "--cores", str(self.cores), "--memory", self.memory,
                     "--host", self.host, "--webui-port", "0", "--work-dir", str(work)],
                    env=env, ready=lambda: len(self.alive_workers()) > i, timeout=timeout)  # noqa: B023 (polled now)
        except BaseException:  # not a catch: whatever stopped the start (an interrupt too), stop all, re-raise
            self.stop()
            raise

    def stop(self) -> None:
        for i in reversed(range(self.workers)):
            self._part(f"worker-{i}").stop()
        self._part("master").stop()
