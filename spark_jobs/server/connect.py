"""The Spark Connect server: one long-lived Spark application that short jobs reach as clients.

A DAG run's tasks and a backfill's runs each used to start their own Spark application (a cold JVM, cold JIT, cold
Python workers). The server is started once, from the Spark that pyspark ships (``SparkConnectServer`` is in its jars),
with the same fixed settings every session of the lake gets (:func:`spark_jobs.spark_session.server_conf`); jobs then
connect with ``sc://host:port`` in about a second.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from spark_jobs.errors import ComputeError, UsageError
from spark_jobs.server.process import Background
from spark_jobs.spark_session import SessionConfig, ensure_java_home, server_conf

__all__ = ["ConnectServer", "port_open", "spark_home"]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> str:
    """``$SPARK_HOME``, else the Spark inside the installed pyspark package."""
    import pyspark

    return os.environ.get("SPARK_HOME") or str(Path(pyspark.__file__).parent)


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class ConnectServer:
    """A Spark Connect server on ``host:port`` whose driver runs on ``master``; ``host`` is the address it listens on
    (127.0.0.1 keeps it private to this machine; 0.0.0.0 in a container that other containers reach)."""

    state_dir: Path
    host: str = "127.0.0.1"
    port: int = 15002
    master: str = field(default_factory=lambda: os.environ.get("SPARK_MASTER", "local[*]"))
    driver_memory: str = field(default_factory=lambda: os.environ.get("SPARK_DRIVER_MEMORY", "2g"))
    shuffle_partitions: int | None = None  # None: follow the master (see session.initial_shuffle_partitions)
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise UsageError(f"bad Spark Connect port {self.port} (--port); use 1-65535 (Spark's default is 15002)")
        SessionConfig(master=self.master, shuffle_partitions=self.shuffle_partitions, remote=None)  # validates

    @property
    def process(self) -> Background:
        return Background("connect-server", self.state_dir)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"sc://{host}:{self.port}"

    def command(self) -> list[str]:
        conf = server_conf(SessionConfig(master=self.master, app_name="spark_jobs connect server", remote=None,
                                         shuffle_partitions=self.shuffle_partitions,
                                         driver_memory=self.driver_memory, extra=self.extra))
        conf.update({"spark.connect.grpc.binding.address": self.host,
                     "spark.connect.grpc.binding.port": str(self.port)})
        cmd = [str(Path(spark_home()) / "bin" / "spark-submit"), "--master", self.master,
               "--name", "spark_jobs connect server", "--driver-memory", self.driver_memory]
        for key, value in conf.items():
            if key != "spark.driver.memory":
                cmd += ["--conf", f"{key}={value}"]
        return [*cmd, "--class", SERVER_CLASS, "spark-internal"]

    def environment(self) -> dict[str, str]:
        ensure_java_home()
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
        env.update({
            "SPARK_HOME": spark_home(),
            # mapInArrow UDAFs run in the server's Python workers: they import spark_jobs from this venv
            "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "PYARROW_IGNORE_TIMEZONE": "1",
        })
        if self.host in ("127.0.0.1", "localhost"):
            env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        return env

    def running(self) -> bool:
        return self.process.pid() is not None and port_open("127.0.0.1" if self.host == "0.0.0.0" else self.host,
                                                            self.port)

    def start(self, timeout: float = 120) -> int:
        """Start the server (or find it running); return its pid once it accepts connections."""
        if (pid := self.process.pid()) is not None:
            return pid
        probe = "127.0.0.1" if self.host == "0.0.0.0" else self.host
        if port_open(probe, self.port):
            raise ComputeError(f"port {self.port} is in use by another process; stop it or start the server "
                               f"with --port (and point SPARK_REMOTE at the new port)")
        return self.process.start(self.command(), env=self.environment(), timeout=timeout,
                                  ready=lambda: port_open(probe, self.port))

    def stop(self) -> bool:
        return self.process.stop()
