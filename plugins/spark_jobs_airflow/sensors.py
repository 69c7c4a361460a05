"""Sensors: a landing partition has data files; a Delta table reached a version. No Spark."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator

__all__ = ["DeltaVersionSensor", "LandingPartitionSensor"]


class LandingPartitionSensor(BaseSensorOperator):
    """Wait until ``<source.path>/event_date=<date>`` holds at least ``min_files`` data files. Defaults to
    ``mode="reschedule"``: no worker slot is held between pokes."""

    template_fields: Sequence[str] = ("pipeline", "date")

    def __init__(self, *, pipeline: str, date: str, min_files: int = 1, **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.date = date
        self.min_files = min_files

    def poke(self, context: Any) -> bool:
        from spark_jobs.lake import storage
        from spark_jobs.spec import load_spec

        path = load_spec(self.pipeline).source.partition_path(self.date)
        files = storage.list_dir(path)
        self.log.info("%s: %d data file(s), waiting for %d", path, len(files), self.min_files)
        return len(files) >= self.min_files


class DeltaVersionSensor(BaseSensorOperator):
    """Wait until the Delta table at ``table_path`` exists and its version is at least ``min_version``."""

    template_fields: Sequence[str] = ("table_path", "min_version")

    def __init__(self, *, table_path: str, min_version: int | str = 0, **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.table_path = table_path
        self.min_version = min_version

    def poke(self, context: Any) -> bool:
        from spark_jobs.lake.reader import table_version

        version = table_version(self.table_path)
        if version is None:
            self.log.info("%s is not a Delta table yet", self.table_path)
            return False
        self.log.info("%s is at version %d, waiting for %s", self.table_path, version, self.min_version)
        return version >= int(self.min_version)
