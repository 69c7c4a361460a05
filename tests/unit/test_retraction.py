"""Changelog (CDC) sources: which aggregates may retract, and min/max's map view algebra."""

from __future__ import annotations

import copy
import re
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.aggregates.builtins import Max, MaxMapView, Min, MinMapView
from spark_jobs.aggregates.registry import create
from spark_jobs.errors import SpecError
from spark_jobs.spec import parse_spec

CDC: dict[str, Any] = {
    "name": "accounts",
    "source": {"path": "landing", "event_time": "at", "op_column": "op",
               "schema": {"at": "timestamp", "op": "string", "owner": "string", "balance": "long",
                          "weight": "double"}},
    "group_by": ["owner"],
    "aggregates": [{"name": "n", "fn": "count"}, {"name": "total", "fn": "sum", "column": "balance"},
                   {"name": "mean", "fn": "avg", "column": "balance"}, {"name": "low", "fn": "min", "column": "balance"},
                   {"name": "high", "fn": "max", "column": "balance"},
                   {"name": "wavg", "fn": "spark_jobs.aggregates.examples:WeightedAvg",
                    "columns": ["balance", "weight"]}],
    "lake": "lake",
}


def cdc(**changes: Any) -> dict[str, Any]:
    raw = copy.deepcopy(CDC)
    for key, value in changes.items():
        target = raw["source"] if key in ("op_column", "schema") else raw
        target[key] = value
    return raw


def test_a_changelog_source_with_retracting_aggregates_is_accepted(tmp_path):
    spec = parse_spec(cdc(), base_dir=tmp_path)
    assert spec.source.op_column == "op"


@pytest.mark.parametrize("fn, column", [
    ("approx_count_distinct", "owner"), ("count_distinct", "owner"), ("first", "owner"), ("last", "owner"),
    ("approx_percentile", "balance"), ("spark_jobs.aggregates.examples:VectorSum", "balance"),
])
def test_an_aggregate_that_cannot_retract_is_rejected_with_the_fix(tmp_path, fn, column):
    raw = cdc()
    entry: dict[str, Any] = {"name": "bad", "fn": fn, "column": column}
    if fn == "approx_percentile":
        entry["args"] = {"q": 0.5}
    raw["aggregates"].append(entry)
    with pytest.raises(SpecError, match=re.escape("aggregates[6].fn: ")) as info:
        parse_spec(raw, base_dir=tmp_path)
    assert "cannot retract" in str(info.value) and "remove source.op_column" in str(info.value)


def test_the_same_aggregates_are_fine_without_an_op_column(tmp_path):
    raw = cdc(op_column=None)
    del raw["source"]["schema"]["op"]  # without op_column, 'op' is a reserved name like any table column
    raw["aggregates"].append({"name": "users", "fn": "approx_count_distinct", "column": "owner"})
    assert parse_spec(raw, base_dir=tmp_path).source.op_column is None


@pytest.mark.parametrize("op_column, schema_type, message", [
    ("kind", None, "column 'kind' is not in source.schema; add it as kind: string"),
    ("op", "long", "column 'op' has type bigint; declare it as string holding +I, -U, +U, -D"),
])
def test_a_bad_op_column_names_the_fix(tmp_path, op_column, schema_type, message):
    raw = cdc(op_column=op_column)
    if schema_type:
        raw["source"]["schema"]["op"] = schema_type
    with pytest.raises(SpecError, match=re.escape(f"source.op_column: {message}")):
        parse_spec(raw, base_dir=tmp_path)


def test_min_max_resolve_to_their_map_view_for_a_changelog_source():
    assert type(create("min", name="m", columns=("v",), input_type="bigint")) is Min
    assert type(create("min", name="m", columns=("v",), input_type="bigint", retracting=True)) is MinMapView
    assert type(create("max", name="m", columns=("v",), input_type="bigint", retracting=True)) is MaxMapView
    assert not Max("m", ("v",)).supports_retract and MaxMapView("m", ("v",)).supports_retract


@st.composite
def changelogs(draw: Any) -> list[tuple[int, int | None]]:
    """(+1/-1, value) rows where a retraction only removes a value that is present (a valid changelog)."""
    rows: list[tuple[int, int | None]] = []
    present: Counter[int | None] = Counter()
    for _ in range(draw(st.integers(0, 40))):
        if present and draw(st.booleans()):
            value = draw(st.sampled_from(sorted(present, key=lambda v: (v is None, v or 0))))
            rows.append((-1, value))
            present[value] -= 1
            if not present[value]:
                del present[value]
        else:
            value = draw(st.one_of(st.none(), st.integers(-5, 5)))
            rows.append((1, value))
            present[value] += 1
    return rows


@pytest.mark.parametrize("cls, pick", [(MinMapView, min), (MaxMapView, max)])
@settings(max_examples=200, deadline=None)
@given(rows=changelogs(), cut=st.integers(0, 40))
def test_map_view_split_into_two_batches_equals_the_net_rows(cls, pick, rows, cut):
    f = cls("m", ("v",), input_type="bigint")

    def fold(part: list[tuple[int, int | None]]) -> Any:
        acc = f.create_accumulator()
        for sign, value in part:
            acc = f.accumulate(acc, value) if sign > 0 else f.retract(acc, value)
        return acc

    net: Counter[int] = Counter()
    for sign, value in rows:
        if value is not None:
            net[value] += sign
    want = pick([v for v, n in net.items() if n > 0], default=None)
    merged = f.merge(fold(rows[:cut]), fold(rows[cut:]))  # a retraction may land in a later batch than its row
    assert f.get_value(merged) == want == f.get_value(fold(rows))
    assert all(n != 0 for n in merged.values())
