"""Shared fixtures: one SparkSession for the whole run, small data, real Delta tables."""

from __future__ import annotations

import logging
import os

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
os.environ.setdefault("SPARK_JOBS_DELTA_BACKEND", "embedded")
logging.getLogger("py4j").setLevel(logging.ERROR)  # py4j logs to a closed stream at interpreter exit


@pytest.fixture(scope="session")
def spark():
    from spark_jobs.session import SessionConfig, build_session

    session = build_session(SessionConfig(master="local[2]", shuffle_partitions=2, app_name="spark_jobs tests",
                                          driver_memory="2g"))
    yield session
    session.stop()
