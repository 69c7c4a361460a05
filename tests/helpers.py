"""Plain helpers that several test modules share: the repo's paths, free ports, stopping a process group, the
rollup the lake view must answer, Spark jobs at once, JVMs that start quickly.

Fixtures stay in ``tests/conftest.py``; importing this module imports nothing heavy (no Spark, no Airflow, no
Arrow), so any test module or harness can use it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from spark_jobs.spec import PipelineSpec

__all__ = ["ROOT", "VENV_BIN", "SparkServer", "at_once", "connect_server", "direct_rollup", "free_port", "quick_jvm",
           "steady_jvm", "stop_process"]

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# JAVA_TOOL_OPTIONS before tests/conftest.py (which imports this module first) makes every JVM start on C1 only
STEADY_JAVA_OPTIONS = os.environ.get("JAVA_TOOL_OPTIONS")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def at_once(spark: SparkSession, jobs: Mapping[str, Callable[[SparkSession], T]]) -> dict[str, Future[T]]:
    """Run every job at once, each in a session of its own (its own SQL settings, one Spark application), and wait
    for all; a job's error is raised by its future's ``result()``, in the test that reads it. A stream's mini-batch
    of a few rows mostly waits on small Spark jobs and commits: the seven Flink pipelines of
    ``tests/integration/test_peer_cases.py`` streamed in 67 s at once, 148 s one after the other."""
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return {name: pool.submit(job, spark.newSession()) for name, job in jobs.items()}


def quick_jvm(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` whose JVMs start quickly: the C1 compiler only (``-XX:TieredStopAtLevel=1``, on top of any
    ``JAVA_TOOL_OPTIONS`` already there), and Spark's classes from a shared archive (:func:`class_archive`). A
    short-lived Spark JVM works a few seconds on a few thousand rows, where C2's compiler threads cost more CPU than
    they save: the cluster's applications took about 40% less wall time with it on two busy cores, a file of session
    and stream-recovery tests 13% less (241 s against 275 s, two runs each). A JVM that lives as long as the suite
    needs C2 (``tests/conftest.py``). What Spark computes does not change."""
    archive = class_archive() if env.get("TEST_CLASS_ARCHIVE") != "0" else None
    shared = f" -XX:SharedArchiveFile={archive} {_QUIET_CDS}" if archive else ""
    return {**env, "JAVA_TOOL_OPTIONS": f"{env.get('JAVA_TOOL_OPTIONS', '')} -XX:TieredStopAtLevel=1{shared}".strip()}


_QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # a JVM of another class path (the launcher) says it cannot use it
_ARCHIVED_JOB = """
import tempfile
from pyspark.sql import SparkSession, functions as F
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
rows = spark.range(100).select((F.col("id") % 7).alias("k"), F.col("id").cast("timestamp").alias("t"))
with tempfile.TemporaryDirectory() as out:
    rows.groupBy("k").agg(F.count("t"), F.max("t")).join(rows, "k").write.parquet(out + "/out")
spark.stop()
"""


def class_archive() -> Path | None:
    """A dynamic class-data-sharing archive of a Spark driver's classes (JDK 17's ``ArchiveClassesAtExit``), made once
    per venv and pyspark version. A driver JVM that maps it starts in about half the time: a local session and a tiny
    job took 7.3 s against 13.1 s (2026-11-28, three runs each), and the suite starts hundreds. A JVM whose class path
    or JDK differs from the archive's ignores it, as Java's own checks decide; None if it cannot be made."""
    import fcntl

    from pyspark import __version__ as spark_version

    archive = Path(sys.prefix) / f"spark-{spark_version}-classes.jsa"
    with open(f"{archive}.lock", "w") as lock:  # pytest-xdist's workers and controller: one makes it, the rest wait
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not archive.exists():
            partial = archive.with_suffix(f".{os.getpid()}.tmp")
            options = f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={partial} {_QUIET_CDS}"
            try:
                proc = subprocess.run([sys.executable, "-c", _ARCHIVED_JOB], capture_output=True, text=True,
                                      env={**os.environ, "JAVA_TOOL_OPTIONS": options}, timeout=300, check=False)
                failure = None if proc.returncode == 0 and partial.exists() else proc.stderr[-2000:]
            except subprocess.TimeoutExpired:
                failure = "its Spark job ran over 300 s"
            if failure is not None:
                print(f"no shared class archive (JVMs start without it): {failure}", file=sys.stderr)
                return None
            partial.rename(archive)
    return archive


_INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


def interpreted_spark(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` whose Spark JVMs (the suite's session, the Connect server, the CLI's and Airflow's jobs) evaluate
    expressions interpreted, as Spark's own test suites also run them: a test's frames hold a few rows, and generating
    and compiling Java for each new plan costs more than it saves (in-process files took 20-25% less: test_null_keys
    96 s against 129 s). A ``spark-defaults.conf`` in ``SPARK_CONF_DIR``, which every spark-submit reads; settings the
    product makes win over it, and what Spark computes does not change. ``TEST_CODEGEN=1`` keeps Spark's code
    generation (the benchmarks and the product always do)."""
    if env.get("TEST_CODEGEN") == "1":
        return dict(env)
    conf_dir = Path(sys.prefix) / "spark-test-conf"
    conf_dir.mkdir(exist_ok=True)
    written = conf_dir / f"spark-defaults.conf.{os.getpid()}"  # xdist's processes: each writes whole, then renames
    written.write_text("".join(f"{k} {v}\n" for k, v in _INTERPRETED.items()))
    written.replace(conf_dir / "spark-defaults.conf")
    return {**env, "SPARK_CONF_DIR": str(conf_dir)}


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 30) -> None:
    """Stop a process started with ``start_new_session=True`` and its children: SIGTERM to the group, then SIGKILL.

    The group is signalled even when its leader has exited already, so no worker it left behind keeps a port.
    """
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


def direct_rollup(lake: str, spec: PipelineSpec, start: str, end: str, by: tuple[str, ...],
                  grain_s: int | None = None, where: str | None = None) -> pa.Table:
    """What the lake view's rollup must answer: :func:`spark_jobs.inspection.rollup.rollup` called directly on the
    latest ``<spec.name>.aggregates``, from ``start`` to ``end`` (``YYYY-MM-DD[ HH:MM]``, UTC)."""
    import datetime as dt

    from spark_jobs.inspection import open_version, resolve_table
    from spark_jobs.inspection.rollup import Rollup, rollup

    request = Rollup(dt.datetime.fromisoformat(start).replace(tzinfo=dt.UTC),
                     dt.datetime.fromisoformat(end).replace(tzinfo=dt.UTC), by, grain_s, where)
    return rollup(open_version(resolve_table(f"{spec.name}.aggregates", lake)), spec, request)


@contextlib.contextmanager
def steady_jvm():
    """``JAVA_TOOL_OPTIONS`` as it was before :func:`tests.helpers.quick_jvm`, while a long-lived JVM starts."""
    with pytest.MonkeyPatch.context() as patch:
        if STEADY_JAVA_OPTIONS is None:
            patch.delenv("JAVA_TOOL_OPTIONS")
        else:
            patch.setenv("JAVA_TOOL_OPTIONS", STEADY_JAVA_OPTIONS)
        yield


@dataclass(frozen=True)
class SparkServer:
    """The session's Spark Connect server and warm runner (``python -m spark_jobs server start``)."""

    remote: str
    runner: str
    state_dir: Path

    def env(self) -> dict[str, str]:
        return {**os.environ, "SPARK_REMOTE": self.remote, "SPARK_JOBS_RUNNER": self.runner}


@contextlib.contextmanager
def connect_server(master: str = "local[2]", shuffle_partitions: int = 2, env: dict[str, str] | None = None
                   ) -> Iterator[SparkServer]:
    """A real Spark Connect server and warm runner on ``master`` (``python -m spark_jobs server start``)."""
    state = Path(tempfile.mkdtemp(prefix="sj-"))  # short: the runner's socket path must fit in 108 bytes
    port = free_port()
    command = [sys.executable, "-m", "spark_jobs", "server"]
    with steady_jvm():
        proc = subprocess.run([*command, "start", "--state-dir", str(state), "--port", str(port), "--master", master,
                               "--driver-memory", "1g", "--shuffle-partitions", str(shuffle_partitions)],
                              env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"server start failed:\n{proc.stdout}\n{proc.stderr}"
    try:
        yield SparkServer(f"sc://127.0.0.1:{port}", str(state / "runner.sock"), state)
    finally:
        subprocess.run([*command, "stop", "--state-dir", str(state)], env=env, capture_output=True, timeout=120,
                       check=False)
        shutil.rmtree(state, ignore_errors=True)
