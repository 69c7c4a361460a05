"""The column-wise session merge the driver uses (``session_labels``, ``Sessions.serve_arrow``) against a row-wise
one written here, as Flink's MergingWindowSet merges: the same sessions from any partial sessions, NULL keys included;
and the state's sessions a batch reaches and keeps."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.spec import Duration
from spark_jobs.windows import Sessions
from spark_jobs.windows.session import session_labels

T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
GAP = Sessions(Duration(60))
TS = pa.timestamp("us", tz="UTC")

spans = st.lists(st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 500), st.integers(0, 200)),
                 max_size=40)


def _table(rows: list[tuple[str | None, int, int]]) -> pa.Table:
    return pa.table({"user": pa.array([u for u, _, _ in rows], pa.string()),
                     "window_start": pa.array([T0 + dt.timedelta(seconds=s) for _, s, _ in rows], TS),
                     "window_end": pa.array([T0 + dt.timedelta(seconds=s + 60 + n) for _, s, n in rows], TS)})


def _sessions_of(labels: list[int]) -> set[frozenset[int]]:
    out: dict[int, set[int]] = {}
    for i, label in enumerate(labels):
        out.setdefault(label, set()).add(i)
    return {frozenset(v) for v in out.values()}


def _row_wise(rows: list[dict[str, Any]], keys: list[str]) -> dict[tuple[Any, ...], set[int]]:
    """Per key, partials sorted by start; one that starts at or before the latest end so far joins that session."""
    by_key: dict[tuple[Any, ...], list[tuple[int, dict[str, Any]]]] = {}
    for i, row in enumerate(rows):
        by_key.setdefault(tuple(row[k] for k in keys), []).append((i, row))
    out: dict[tuple[Any, ...], set[int]] = {}
    for key, partials in by_key.items():
        sessions: list[list[Any]] = []  # [start, latest end, members]
        for i, row in sorted(partials, key=lambda p: (p[1]["window_start"], p[1]["window_end"])):
            if sessions and row["window_start"] <= sessions[-1][1]:
                sessions[-1][1] = max(sessions[-1][1], row["window_end"])
                sessions[-1][2].add(i)
            else:
                sessions.append([row["window_start"], row["window_end"], {i}])
        out.update({(*key, start, end): members for start, end, members in sessions})
    return out


@settings(max_examples=200, deadline=None)
@given(spans)
def test_the_column_wise_sessions_are_the_row_wise_ones(rows):
    table = _table(rows)
    for keys in (["user"], []):
        reference = _row_wise(table.to_pylist(), keys)
        assert _sessions_of(session_labels(table, keys).tolist()) == {frozenset(m) for m in reference.values()}
        served = GAP.serve_arrow(table, keys).to_pylist()
        assert {i: (*(r[k] for k in keys), r["window_start"], r["window_end"]) for i, r in enumerate(served)} == {
            i: session for session, members in reference.items() for i in members}


def test_a_batch_reaches_the_state_sessions_it_touches_and_absorbs_them():
    state = _table([("a", 0, 0), ("a", 300, 0), ("b", 0, 0), (None, 0, 0)])  # a: [0, 60) and [300, 360)
    changed = _table([("a", 50, 0), (None, 200, 0)])  # touches a's first; NULL's only after its end
    reached = GAP.reach_in_state_arrow(changed, state, ["user"])
    assert reached.to_pylist() == state.slice(0, 1).to_pylist()
    bridge = _table([("a", 100, 150)])  # [100, 310): reaches a's second through a's first? no: starts after 60
    assert GAP.reach_in_state_arrow(bridge, state, ["user"]).to_pylist() == state.slice(1, 1).to_pylist()
