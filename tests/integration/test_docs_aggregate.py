"""docs/aggregates.md adds a built-in as one class: that very class works in every phase."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spark_jobs.aggregates.builtins import BUILTINS, RETRACTING
from spark_jobs.errors import SpecError
from spark_jobs.phases import CompiledAggregates, final_aggregate, partial_aggregate
from spark_jobs.phases.arrow_merge import merge_groups, value_columns
from spark_jobs.spec import parse_spec

DOC = Path(__file__).resolve().parents[2] / "docs" / "aggregates.md"
ROWS = [("a", 5), ("a", 9), ("a", None), ("b", 3), ("b", 3), ("c", None), ("a", -2), ("b", 11)]


@pytest.fixture(scope="module")
def spread() -> Iterator[type[Any]]:
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S) if "@builtin()" in b]
    namespace: dict[str, Any] = {}
    exec(compile(block, str(DOC), "exec"), namespace)  # the documented example, run as written
    try:
        yield namespace["Spread"]
    finally:
        BUILTINS.pop("spread", None)
        RETRACTING.pop("spread", None)


def _spec(column_type: str = "long") -> Any:
    return parse_spec({"name": "s", "lake": "lake", "group_by": ["k"],
                       "source": {"path": "landing", "event_time": "t",
                                  "schema": {"t": "timestamp", "k": "string", "v": column_type}},
                       "aggregates": [{"name": "spread_v", "fn": "spread", "column": "v"}]})


def _oracle() -> dict[str, Any]:
    df = pd.DataFrame(ROWS, columns=["k", "v"])
    out = df.groupby("k")["v"].agg(lambda s: s.max() - s.min() if s.notna().any() else None)
    return {k: (None if pd.isna(v) else int(v)) for k, v in out.items()}


def test_the_spec_accepts_it_and_checks_its_column(spread):
    assert BUILTINS["spread"] is spread
    assert [b.acc_columns for b in CompiledAggregates(_spec()).entries] == [["spread_v__low", "spread_v__high"]]
    with pytest.raises(SpecError, match="spread needs a numeric column"):
        _spec("string")


@pytest.mark.spark
def test_its_spark_phases_and_its_driver_merge_equal_the_oracle(spark, spread):
    compiled = CompiledAggregates(_spec())
    rows = spark.createDataFrame(ROWS, "k string, v long").selectExpr("timestamp'2024-03-01' AS t", "*")
    halves = [rows.where("v IS NULL OR v < 5"), rows.where("v >= 5")]  # two batches: partials to merge
    partials = partial_aggregate(halves[0], compiled).unionByName(partial_aggregate(halves[1], compiled))
    by_spark = {r["k"]: r["spread_v"] for r in final_aggregate(partials, compiled).collect()}
    assert by_spark == _oracle()
    merged, accs = merge_groups(partials.toArrow(), ["k"], compiled.entries)
    by_driver = value_columns(merged, accs, compiled.entries)["spread_v"].to_pylist()
    assert dict(zip(merged.column("k").to_pylist(), by_driver, strict=True)) == _oracle()
