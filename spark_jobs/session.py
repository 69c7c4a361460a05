"""The one place that builds a SparkSession.

Jobs, operators and the CLI call :func:`build_session`; tests build theirs through the same
function with a smaller config. Settings that the tables depend on (UTC session time,
microsecond Parquet timestamps, no ``_SUCCESS`` markers inside Delta tables) are fixed
here so every writer produces the same files.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SessionConfig", "build_session", "ensure_java_home"]

# Settings every session gets: the lake's files must not depend on who wrote them.
_FIXED_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.parquet.enable.summary-metadata": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.sql.legacy.timeParserPolicy": "CORRECTED",
    "spark.driver.extraJavaOptions": "-Dderby.system.home=/tmp/derby -XX:+UseG1GC",
    # Sketch accumulators (HLL, KLL) aggregate in an object hash map that falls back to sorting
    # every row past 128 groups per task; ~16k groups of a few KB each stay well inside memory.
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "16384",
}


@dataclass(frozen=True)
class SessionConfig:
    """How to reach Spark. ``master`` defaults to ``$SPARK_MASTER`` or ``local[*]``."""

    master: str = field(default_factory=lambda: os.environ.get("SPARK_MASTER", "local[*]"))
    app_name: str = "spark_jobs"
    shuffle_partitions: int = 8
    driver_memory: str = field(default_factory=lambda: os.environ.get("SPARK_DRIVER_MEMORY", "2g"))
    ui: bool = False
    progress: bool = False
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.master or not (self.master.startswith(("local", "spark://", "yarn", "k8s://", "mesos://"))):
            raise ValueError(
                f"bad Spark master {self.master!r}; use local[*], local[N], spark://host:7077, yarn or k8s://..."
            )
        if self.shuffle_partitions < 1:
            raise ValueError(f"shuffle_partitions must be >= 1, got {self.shuffle_partitions}")


def ensure_java_home() -> None:
    """PySpark 4 needs JAVA_HOME; derive it from the ``java`` on PATH when unset."""
    if os.environ.get("JAVA_HOME"):
        return
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("no Java found: install a JDK 17 or 21 and put 'java' on PATH, or set JAVA_HOME")
    os.environ["JAVA_HOME"] = str(Path(java).resolve().parent.parent)


def build_session(config: SessionConfig | None = None) -> SparkSession:
    """Build (or return the active) SparkSession configured for the lake."""
    from pyspark.sql import SparkSession

    config = config or SessionConfig()
    ensure_java_home()
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    builder = SparkSession.builder.master(config.master).appName(config.app_name)
    conf = dict(_FIXED_CONF)
    conf.update(
        {
            "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
            "spark.driver.memory": config.driver_memory,
            "spark.ui.enabled": str(config.ui).lower(),
            "spark.ui.showConsoleProgress": str(config.progress).lower(),
        }
    )
    conf.update(dict(config.extra))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "ERROR"))
    return spark


def _python() -> str:
    import sys

    return sys.executable


def delta_jars_available(spark: SparkSession) -> bool:
    """True when the Delta Lake Spark classes are on the driver's classpath."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")
        return True
    except Exception:
        return False

