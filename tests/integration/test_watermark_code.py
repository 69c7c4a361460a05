"""A new watermark each mini-batch must not make the pass new code: Spark writes a long literal into the Java it
generates, so a watermark compared as one made every batch's pass compile (janino) and warm up (the JIT) again."""

from __future__ import annotations

import datetime as dt

import pytest

from spark_jobs.durations import Duration
from spark_jobs.spark_functions import F
from spark_jobs.stream.query import _session_conf
from spark_jobs.windows import Cumulative, Hopping, Sessions, Tumbling

pytestmark = pytest.mark.spark

HOUR = Duration(3600)
KINDS = [Tumbling(HOUR), Hopping(HOUR, Duration(900)), Cumulative(Duration(86_400), HOUR), Sessions(Duration(1800))]
EVENT = dt.datetime(2024, 3, 1, 0, 5, tzinfo=dt.UTC)
# as in a mini-batch, whatever the suite's session sets: generated code, and the plan that runs is the one planned
GENERATED = {"spark.sql.codegen.wholeStage": "true", "spark.sql.codegen.factoryMode": "FALLBACK",
             "spark.sql.adaptive.enabled": "false"}


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: type(k).__name__)
def test_the_lateness_tests_compile_to_the_same_code_for_every_watermark(spark, kind):
    micros = int(EVENT.timestamp()) * 1_000_000
    rows = spark.range(2).select(F.timestamp_micros(F.lit(micros) + F.col("id")).alias("event_time"),
                                 F.timestamp_micros(F.lit(micros + 3_600_000_000) + F.col("id")).alias("window_end"),
                                 F.timestamp_micros(F.lit(micros) + F.col("id")).alias("window_start"))

    def generated(watermark: dt.datetime) -> tuple[list[str], tuple[bool, bool]]:
        frame = rows.select(kind.may_be_late(F.col("event_time"), watermark).alias("late"),
                            kind.is_open(watermark).alias("open"))
        stages = spark._jvm.org.apache.spark.sql.execution.debug.package.codegenStringSeq(
            frame._jdf.queryExecution().executedPlan())
        first = frame.orderBy("late").first()
        return [stages.apply(i)._2() for i in range(stages.size())], (first["late"], first["open"])

    with _session_conf(spark, GENERATED):
        early_code, early = generated(EVENT)
        late_code, late = generated(EVENT + dt.timedelta(days=3))
    assert early == (False, True) and late == (True, False)  # each watermark is read: the answers differ
    assert early_code and early_code == late_code
