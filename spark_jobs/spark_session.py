"""The one place that builds a SparkSession: jobs, operators, the CLI and tests call :func:`build_session`. Settings
the tables depend on (UTC session time, microsecond Parquet timestamps, no ``_SUCCESS`` markers in Delta tables) are
fixed here so every writer produces the same files. A session either starts its own Spark application (``local[*]``
or a cluster master) or is a Spark Connect client (``--remote`` or ``$SPARK_REMOTE``, ``sc://host:15002``) of a
long-lived server that many short jobs share warm, started with the same settings (:func:`server_conf`;
``spark_jobs.server.connect``)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.errors import ComputeError, UsageError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SessionConfig", "build_session", "ensure_java_home", "initial_shuffle_partitions", "server_conf",
           "shuffle_partitions_for"]

# Settings every session gets: the lake's files must not depend on who wrote them.
_FIXED_CONF = {
    "spark.sql.session.timeZone": "UTC", "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.parquet.enable.summary-metadata": "false", "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.adaptive.enabled": "true", "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.sources.partitionOverwriteMode": "dynamic", "spark.sql.legacy.timeParserPolicy": "CORRECTED",
    "spark.driver.extraJavaOptions": "-Dderby.system.home=/tmp/derby -XX:+UseG1GC",
    # Sketch accumulators (HLL, KLL) aggregate in an object hash map that falls back to sorting
    # every row past 128 groups per task; ~16k groups of a few KB each stay well inside memory.
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "16384",
}
# The master URLs Spark's SparkContext accepts (its local[N], local[N, F] and local-cluster[...] forms).
_MASTER = re.compile(r"^(local(\[(\*|\d+)(\s*,\s*\d+)?\])?|local-cluster\[\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\]"
                     r"|yarn|(spark|k8s|mesos)://\S+)$")
# Only a Spark application's own start sets these; a Connect client leaves them to the server.
_STATIC_PREFIXES = ("spark.driver.", "spark.executor.", "spark.hadoop.", "spark.ui.", "spark.master")


@dataclass(frozen=True)
class SessionConfig:
    """How to reach Spark: a Connect server (``remote``, default ``$SPARK_REMOTE``), else an own
    application on ``master`` (default ``$SPARK_MASTER`` or ``local[*]``)."""

    master: str = field(default_factory=lambda: os.environ.get("SPARK_MASTER", "local[*]"))
    remote: str | None = field(default_factory=lambda: os.environ.get("SPARK_REMOTE") or None)
    app_name: str = "spark_jobs"
    shuffle_partitions: int | None = None  # None: follow the cluster's cores (:func:`shuffle_partitions_for`)
    driver_memory: str = field(default_factory=lambda: os.environ.get("SPARK_DRIVER_MEMORY", "2g"))
    executor_cores: int | None = field(default_factory=lambda: _int_env("SPARK_EXECUTOR_CORES"))
    executor_memory: str | None = field(default_factory=lambda: os.environ.get("SPARK_EXECUTOR_MEMORY") or None)
    ui: bool = field(default_factory=lambda: os.environ.get("SPARK_JOBS_UI", "true").lower() not in ("0", "false", "no"))
    progress: bool = False
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not _MASTER.match(self.master or ""):
            raise UsageError(f"bad Spark master {self.master!r} (--master or $SPARK_MASTER); use local[*], local[N], "
                             "spark://host:7077, yarn or k8s://https://host:port")
        if self.remote is not None:
            if not self.remote.startswith("sc://"):
                raise UsageError(f"bad Spark Connect address {self.remote!r} (--remote or $SPARK_REMOTE); use "
                                 "sc://host:port, e.g. sc://127.0.0.1:15002")
            address(self.remote)
        for what, value, where in (("shuffle partitions", self.shuffle_partitions, "--shuffle-partitions"),
                                   ("executor cores", self.executor_cores, "--executor-cores or $SPARK_EXECUTOR_CORES")):
            if value is not None and value < 1:
                raise UsageError(f"bad {what} {value} ({where}); use 1 or more")


def _int_env(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value else None
    except ValueError:
        raise UsageError(f"bad ${name} {value!r}; use a whole number") from None


MIN_SHUFFLE_PARTITIONS = 8
# Before a cluster's executors register, its cores are unknown: start generous (Spark's own default)
# and let adaptive execution coalesce to the cores that came (parallelismFirst). A session of its own
# then sets :func:`shuffle_partitions_for` its cores; a Connect server keeps this.
CLUSTER_SHUFFLE_PARTITIONS = 200
_LOCAL_CORES = re.compile(r"^local(?:\[(\*|\d+))?")  # local without threads (or local-cluster): 1


def shuffle_partitions_for(cores: int) -> int:
    """Two shuffle partitions per core of the cluster, at least 8; adaptive execution coalesces
    the small ones, so a generous number costs little and a large cluster is not left idle."""
    return max(MIN_SHUFFLE_PARTITIONS, 2 * cores)


def initial_shuffle_partitions(config: SessionConfig) -> int:
    """The shuffle partitions an application starts with: the flag's, else those of a local master's
    threads, else :data:`CLUSTER_SHUFFLE_PARTITIONS` for a cluster whose cores are not known yet."""
    if config.shuffle_partitions is not None:
        return config.shuffle_partitions
    if found := _LOCAL_CORES.match(config.master):
        threads = found.group(1) or "1"
        return shuffle_partitions_for((os.cpu_count() or 1) if threads == "*" else int(threads))
    return CLUSTER_SHUFFLE_PARTITIONS


def ensure_java_home() -> None:
    """PySpark 4 needs JAVA_HOME; derive it from the ``java`` on PATH when unset."""
    if os.environ.get("JAVA_HOME"):
        return
    if (java := shutil.which("java")) is None:
        raise ComputeError("no Java found: install a JDK 17 or 21 and put 'java' on PATH, or set JAVA_HOME")
    os.environ["JAVA_HOME"] = str(Path(java).resolve().parent.parent)


def build_session(config: SessionConfig | None = None) -> SparkSession:
    """Build (or return the active) SparkSession configured for the lake."""
    from pyspark.sql import SparkSession

    config = config or SessionConfig()
    if config.remote:
        return _connect(config)
    os.environ.pop("SPARK_REMOTE", None)  # else pyspark's builder turns into a Connect client itself
    ensure_java_home()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    # dataFrameDebugging: PySpark otherwise walks the Python stack and makes four JVM calls per DataFrame call, to
    # name the line in an error's query context: a third of a mini-batch's planning (static: set at the start only)
    conf: dict[str, Any] = {**server_conf(config), "spark.python.sql.dataFrameDebugging.enabled": "false"}
    spark = SparkSession.builder.master(config.master).appName(config.app_name).config(map=conf).getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "ERROR"))
    if config.shuffle_partitions is None:
        # the cores the executors offer: on a cluster they register a moment after the application starts, so wait
        # (bounded) for the first, then count what registered (a size of 1 is the driver's own)
        if config.master.startswith(("spark://", "yarn", "k8s://", "mesos://")):
            deadline = time.monotonic() + 15.0
            while sc._jsc.sc().getExecutorMemoryStatus().size() <= 1 and time.monotonic() < deadline:
                time.sleep(0.25)
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions_for(int(sc.defaultParallelism))))
    return spark


def server_conf(config: SessionConfig) -> dict[str, str]:
    """Every setting a Spark application of the lake starts with (a Connect server included)."""
    conf = {**_FIXED_CONF, "spark.sql.shuffle.partitions": str(initial_shuffle_partitions(config)),
            "spark.driver.memory": config.driver_memory, "spark.ui.enabled": str(config.ui).lower(),
            "spark.ui.showConsoleProgress": str(config.progress).lower()}
    executor = {"cores": config.executor_cores, "memory": config.executor_memory}
    return conf | {f"spark.executor.{k}": str(v) for k, v in executor.items() if v is not None} | dict(config.extra)


def _connect(config: SessionConfig) -> SparkSession:
    """A Spark Connect client session; fails at once, naming the fix, when no server listens."""
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    assert config.remote is not None
    host, port = address(config.remote)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        raise ComputeError(
            f"no Spark Connect server answers at {config.remote} ({exc.strerror or exc}); start one with "
            "`python -m spark_jobs server start`, or unset SPARK_REMOTE (and drop --remote) to run "
            "Spark in this process") from exc
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    # the server's shuffle partitions, which follow its cluster, unless the flag sets them
    conf: dict[str, Any] = {k: v for k, v in server_conf(config).items() if not k.startswith(_STATIC_PREFIXES)
                            and not (k == "spark.sql.shuffle.partitions" and config.shuffle_partitions is None)}
    spark = SparkSession.builder.remote(config.remote).config(map=conf).getOrCreate()
    # a server that stops answering fails the job within about a minute, not pyspark's ten (15 tries, 60 s apart)
    if (client := getattr(spark, "client", None)) is not None:
        client.set_retry_policies([DefaultPolicy(max_retries=8, max_backoff=10_000)])
    return spark


def close_remote() -> None:
    """Release this process's Spark Connect session, if it made one, while the server still answers."""
    if "pyspark.sql.connect.session" not in sys.modules:
        return
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    if (active := RemoteSession.getActiveSession()) is not None:
        active.stop()


def address(remote: str) -> tuple[str, int]:
    """``(host, port)`` of ``sc://host:port/;params`` (port 15002 when absent, as Spark Connect's default)."""
    netloc = remote.removeprefix("sc://").split("/", 1)[0].split(";", 1)[0]
    host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "")
    try:
        return host or "127.0.0.1", int(port or 15002)
    except ValueError as exc:
        raise UsageError(f"bad Spark Connect address {remote!r} (--remote or $SPARK_REMOTE): port {port!r} is not "
                         "a number; use sc://host:port, e.g. sc://127.0.0.1:15002") from exc


def delta_jars_available(spark: SparkSession) -> bool:
    """True when the Delta Lake Spark classes are on the driver's classpath."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):  # a Connect client: the server's extensions say
        return "DeltaSparkSessionExtension" in (spark.conf.get("spark.sql.extensions", "") or "")
    from py4j.protocol import Py4JError

    if (jvm := spark.sparkContext._jvm) is None:  # no JVM gateway to look the class up in
        return False
    try:
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")
    except Py4JError:  # ClassNotFoundException, as py4j raises it
        return False
    return True

