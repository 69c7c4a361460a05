"""The Arrow types each aggregate declares for its stored columns are the ones Spark's phases write.

``apply`` adds a new aggregate's columns from these declarations, without Spark; the next combine then
writes Spark's columns into them, so the two must agree for every built-in, input type and changelog form.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from spark_jobs.aggregates.builtins import BUILTINS, NUMERIC, RETRACTING
from spark_jobs.lake._embedded import _nullable
from spark_jobs.lake.layout import table_schema
from spark_jobs.phases import CompiledAggregates, final_aggregate, partial_aggregate
from spark_jobs.spec import parse_spec

pytestmark = pytest.mark.spark

TYPES = ["int", "bigint", "double", "string", "timestamp"]


def _spec(column_type: str, *, changelog: bool) -> Any:
    aggregates = []
    for fn, cls in BUILTINS.items():
        if cls.numeric_only and column_type not in NUMERIC:
            continue
        if changelog and fn not in RETRACTING:
            continue
        args = {"args": {"q": 0.5}} if fn == "approx_percentile" else {}
        aggregates.append({"name": f"a_{fn}", "fn": fn, **({"column": "v"} if cls.column_required else {}), **args})
    schema = {"t": "timestamp", "k": "string", "v": column_type, **({"op": "string"} if changelog else {})}
    return parse_spec({"name": "s", "lake": "lake", "group_by": ["k"], "window": {"size": "1 hour"},
                       "source": {"path": "landing", "event_time": "t", "schema": schema,
                                  **({"op_column": "op"} if changelog else {})},
                       "aggregates": aggregates})


@pytest.mark.parametrize("changelog", [False, True])
@pytest.mark.parametrize("column_type", TYPES)
def test_declared_columns_are_what_spark_writes(spark, column_type, changelog):
    spec = _spec(column_type, changelog=changelog)
    if not spec.aggregates:
        pytest.skip("no aggregate takes this input in this form")
    compiled = CompiledAggregates(spec)
    fields = ", ".join(f"`{c}` {t}" for c, t in spec.source.schema)
    rows = spark.createDataFrame([], fields)
    partial = partial_aggregate(spec.window.assign(rows, event_time=spec.source.event_time, keys=spec.group_by), compiled)
    final = final_aggregate(partial, compiled)
    for frame, table in ((partial, "partials"), (final, "aggregates")):
        # as the embedded backend stores them: nullable all the way down
        written = {f.name: str(f.type) for f in _nullable(to_arrow_schema(frame.schema, timezone="UTC"))}
        declared = {f.name: str(f.type) for f in table_schema(spec, table) if f.name in written}
        assert declared == {name: written[name] for name in declared}, table
        assert set(declared) >= {c for b in compiled.entries for c in b.acc_columns}
