"""Changelog (CDC) sources: which aggregates may retract, and the map view algebra of min, max and count_distinct."""

from __future__ import annotations

import copy
import re
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.aggregates.builtins import CountDistinct, CountDistinctMapView, Max, MaxMapView, Min, MinMapView
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
    ("approx_count_distinct", "owner"), ("first", "owner"), ("last", "owner"),
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


def test_count_distinct_resolves_to_its_map_view_and_a_changelog_source_accepts_it(tmp_path):
    raw = cdc()
    raw["aggregates"].append({"name": "owners", "fn": "count_distinct", "column": "owner"})
    assert [a.fn for a in parse_spec(raw, base_dir=tmp_path).aggregates][-1] == "count_distinct"
    assert type(create("count_distinct", name="d", columns=("v",), input_type="bigint")) is CountDistinct
    f = create("count_distinct", name="d", columns=("v",), input_type="bigint", retracting=True)
    assert type(f) is CountDistinctMapView and f.supports_retract and not CountDistinct("d", ("v",)).supports_retract
    assert (f.acc_fields, f.acc_types(), f.value_type()) == (("counts",), [pa.map_(pa.int64(), pa.int64())], pa.int64())


def fold(f: Any, rows: list[tuple[int, Any]]) -> Any:
    """Replay (+1/-1, value) rows: +I/+U accumulate, -U/-D retract."""
    acc = f.create_accumulator()
    for sign, value in rows:
        acc = f.accumulate(acc, value) if sign > 0 else f.retract(acc, value)
    return acc


def test_count_distinct_retracts_a_value_to_zero_and_counts_it_again_when_re_added():
    f = CountDistinctMapView("d", ("v",), input_type="bigint")
    rows = [(1, 10), (1, 10), (1, 20), (1, None)]  # +I 10, +I 10, +I 20, +I NULL: {10, 20}
    assert f.get_value(fold(f, rows)) == 2
    rows += [(-1, 10)]  # -U 10: one row of 10 is still live
    assert f.get_value(fold(f, rows)) == 2
    rows += [(-1, 10), (-1, 20)]  # -D 10, -D 20: nothing live, and no zero count kept
    assert (fold(f, rows), f.get_value(fold(f, rows)), f.encode(fold(f, rows))) == ({}, 0, [None])
    rows += [(1, 10)]  # +U 10: back in
    assert (fold(f, rows), f.get_value(fold(f, rows))) == ({10: 1}, 1)


def test_count_distinct_merges_partials_with_negative_counts():
    """A retraction combined in a later batch than its row leaves a negative count there; the merge cancels it."""
    f = CountDistinctMapView("d", ("v",), input_type="string")
    day1, day2 = fold(f, [(1, "a"), (1, "b"), (1, "b")]), fold(f, [(-1, "b"), (-1, "a"), (1, "c"), (-1, "b")])
    assert (day2, f.get_value(day2)) == ({"a": -1, "b": -2, "c": 1}, 1)
    assert f.merge(f.merge(f.create_accumulator(), day1), day2) == {"c": 1} == f.merge(day2, day1)
    stored = pa.array(f.encode(day2), type=f.acc_types()[0])  # negative counts survive the stored map column
    assert f.decode([stored[0].as_py()]) == day2
    assert f.get_value(f.merge_all([day1, day2, fold(f, [(1, "a")])])) == 2


@pytest.mark.parametrize("cls, value_of", [
    (MinMapView, lambda live: min(live, default=None)), (MaxMapView, lambda live: max(live, default=None)),
    (CountDistinctMapView, len)])
@settings(max_examples=200, deadline=None)
@given(rows=changelogs(), cut=st.integers(0, 40))
def test_map_view_split_into_two_batches_equals_the_net_rows(cls, value_of, rows, cut):
    f = cls("m", ("v",), input_type="bigint")
    net: Counter[int] = Counter()
    for sign, value in rows:
        if value is not None:
            net[value] += sign
    want = value_of([v for v, n in net.items() if n > 0])
    merged = f.merge(fold(f, rows[:cut]), fold(f, rows[cut:]))  # a retraction may land in a later batch than its row
    assert f.get_value(merged) == want == f.get_value(fold(f, rows))
    assert all(n != 0 for n in merged.values())
