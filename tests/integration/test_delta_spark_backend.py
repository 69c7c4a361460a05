"""The delta-spark backend: the same jobs through the Delta Lake Spark jars, where they are available."""

from __future__ import annotations

import pytest

from spark_jobs.errors import LakeError
from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables, open_lake
from spark_jobs.spark_session import delta_jars_available
from tests.builders import FAST_AGGREGATES, day_events, make_spec, write_day
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

NO_JARS = ("Delta Lake Spark jars are not on the classpath (Maven Central is unreachable here); "
           "this backend runs on clusters and the docker image")


def test_combine_and_reduce_through_delta_spark_match_the_oracle(spark, tmp_path):
    if not delta_jars_available(spark):
        pytest.skip(NO_JARS)
    lake = open_lake(spark, "delta-spark")
    assert lake.name == "delta-spark"
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES, window={"size": "1 hour"})
    for i, day in enumerate(("2024-03-01", "2024-03-02")):
        write_day(tmp_path / "landing", day, day_events(day, 80, seed=i, rejected=2))
        record = combine.run(spark, spec, day, lake=lake)
        assert record.rows_in == record.rows_aggregated + 2 and record.rows_rejected == 2 and record.backend == "delta-spark"
    reduce.run(spark, spec, lake=lake)
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(tmp_path / "landing"), spec), spec)
    assert reduce.run(spark, spec, lake=lake).status == "noop"


def test_open_lake_explains_a_missing_or_unknown_backend(spark):
    if delta_jars_available(spark):
        assert open_lake(spark, "delta-spark").name == "delta-spark"
    else:
        with pytest.raises(LakeError, match=r"needs the Delta Lake jars on Spark's classpath"):
            open_lake(spark, "delta-spark")
    with pytest.raises(LakeError, match=r"unknown Delta backend 'nope'; use one of auto, embedded, delta-spark"):
        open_lake(spark, "nope")
    assert open_lake(spark, "embedded").name == "embedded"
