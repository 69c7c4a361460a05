"""The changelog rule's Spark and Arrow forms give the same rows, for random values before and after a batch."""

from __future__ import annotations

import datetime as dt
import itertools
import math
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs.phases.changelog_rule import FIRST_SEEN, ChangelogRule

pytestmark = [pytest.mark.spark]

T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
TS = pa.timestamp("us", tz="UTC")
SIDE = pa.schema([("user", pa.string()), ("window_start", TS), ("window_end", TS), ("views", pa.int64()),
                  ("avg", pa.float64()), ("n_rows", pa.int64())])
CHANGELOG = pa.schema([("op", pa.string()), ("user", pa.string()), ("window_start", TS), ("window_end", TS),
                       ("views", pa.int64()), ("avg", pa.float64()), ("batch_id", pa.int64()), ("seq", pa.int64())])
RULES = {  # a session is named by its key and start (its end is a value); a window by its key and bounds
    "sessions": ChangelogRule(("user", "window_start"), ("window_end", "views", "avg"), ("user",),
                              ("user", "window_start", "window_end", "views", "avg")),
    "windows": ChangelogRule(("user", "window_start", "window_end"), ("views", "avg"), ("user",),
                             ("user", "window_start", "window_end", "views", "avg")),
}

users = st.sampled_from(["ann", "bob", "cid", "dan"])
served = st.fixed_dictionaries({
    "user": users, "start": st.integers(0, 3), "length": st.integers(1, 2),
    "views": st.one_of(st.none(), st.integers(0, 3)),
    "avg": st.one_of(st.none(), st.sampled_from([0.5, 1.5, math.nan])), "n_rows": st.integers(0, 3)})


def side(rows: list[dict[str, Any]], identity: tuple[str, ...]) -> pa.Table:
    """Served rows with one row per identity (the first one generated wins)."""
    seen, out = set(), []
    for r in rows:
        start = T0 + dt.timedelta(hours=r["start"])
        row = {"user": r["user"], "window_start": start, "window_end": start + dt.timedelta(hours=r["length"]),
               "views": r["views"], "avg": r["avg"], "n_rows": r["n_rows"]}
        key = tuple(row[c] for c in identity)
        if key not in seen:
            seen.add(key)
            out.append(row)
    return pa.Table.from_pylist(out, schema=SIDE)


def comparable(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in r.values()) for r in rows]


@pytest.mark.parametrize("kind", sorted(RULES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(served, max_size=6), after=st.lists(served, max_size=6),
       seen=st.dictionaries(users, st.integers(0, 5), min_size=4), small=st.booleans())
def test_the_spark_and_arrow_forms_of_the_rule_agree(spark, kind, before, after, seen, small):
    """Either Spark form: the rows before and the first events joined by a shuffle, or broadcast to the rows after."""
    rule = RULES[kind]
    old, new = side(before, rule.identity), side(after, rule.identity)
    first = pa.table({"user": list(seen), FIRST_SEEN: pa.array([T0 + dt.timedelta(minutes=m) for m in seen.values()],
                                                                TS)})
    by_arrow = rule.arrow(old, new, first, {"batch_id": 7}, CHANGELOG).to_pylist()
    frames = [spark.createDataFrame(t) for t in (old, new, first)]
    by_spark = rule.spark(*frames, {"batch_id": 7}, small=small).toArrow().cast(CHANGELOG).to_pylist()
    assert comparable(by_spark) == comparable(by_arrow)
    assert [r["seq"] for r in by_arrow] == list(range(len(by_arrow)))


def test_a_session_that_grew_is_updated_under_its_start_and_one_absorbed_is_deleted():
    rule = RULES["sessions"]
    old = side([{"user": "ann", "start": 0, "length": 1, "views": 1, "avg": 1.5, "n_rows": 1},
                {"user": "ann", "start": 2, "length": 1, "views": 1, "avg": 0.5, "n_rows": 1}], rule.identity)
    new = side([{"user": "ann", "start": 0, "length": 3, "views": 3, "avg": 1.5, "n_rows": 3}], rule.identity)
    first = pa.table({"user": ["ann"], FIRST_SEEN: pa.array([T0], TS)})
    rows = rule.arrow(old, new, first, {"batch_id": 0}, CHANGELOG).to_pylist()
    assert [(r["op"], r["window_start"].hour, r["window_end"].hour, r["views"]) for r in rows] == [
        ("-U", 0, 1, 1), ("+U", 0, 3, 3), ("-D", 2, 3, 1)]


@pytest.mark.parametrize("kind", sorted(RULES))
@settings(max_examples=40, deadline=None)
@given(before=st.lists(served, max_size=8), after=st.lists(served, max_size=8), cuts=st.sets(st.integers(1, 3)))
def test_a_change_told_in_pieces_of_time_joins_into_the_change_told_whole(kind, before, after, cuts):
    """A full reduce tells its change a few days of windows at a time (``changelog_feed``): each piece holds every row
    of its identities, and the joined pieces are the rows, order and ``seq`` of one telling."""
    rule = RULES[kind]
    old, new = side(before, rule.identity), side(after, rule.identity)
    bounds = [T0, *(T0 + dt.timedelta(hours=h) for h in sorted(cuts)), T0 + dt.timedelta(days=1)]

    def piece(t: pa.Table, lo: dt.datetime, hi: dt.datetime) -> pa.Table:
        return t.filter(pc.and_(pc.greater_equal(t["window_start"], pa.scalar(lo, TS)),
                                pc.less(t["window_start"], pa.scalar(hi, TS))))

    whole = rule.arrow(old, new, None, {"batch_id": None}, CHANGELOG)
    pieces = [rule.arrow(piece(old, lo, hi), piece(new, lo, hi), None, {"batch_id": None}, CHANGELOG)
              for lo, hi in itertools.pairwise(bounds)]
    assert comparable(rule.joined(pieces).to_pylist()) == comparable(whole.to_pylist())
