"""The column-wise session merge the stream's state uses against the row-wise one (``merge_stored_rows``, the
driver's form of :meth:`Sessions.serve`): the same sessions from any partial sessions, NULL keys included; and the
state's sessions a batch reaches and keeps."""

from __future__ import annotations

import datetime as dt

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


@settings(max_examples=200, deadline=None)
@given(spans)
def test_the_column_wise_sessions_are_the_row_wise_ones(rows):
    table = _table(rows)
    labels = session_labels(table, ["user"]).tolist()
    reference = GAP.merge_stored_rows([{**r, "_i": i} for i, r in enumerate(table.to_pylist())], ["user"])
    assert _sessions_of(labels) == {frozenset(r["_i"] for r in members) for members in reference.values()}
    assert _sessions_of(session_labels(table, []).tolist()) == {
        frozenset(r["_i"] for r in members)
        for members in GAP.merge_stored_rows([{**r, "_i": i} for i, r in enumerate(table.to_pylist())], []).values()}


def test_a_batch_reaches_the_state_sessions_it_touches_and_absorbs_them():
    state = _table([("a", 0, 0), ("a", 300, 0), ("b", 0, 0), (None, 0, 0)])  # a: [0, 60) and [300, 360)
    changed = _table([("a", 50, 0), (None, 200, 0)])  # touches a's first; NULL's only after its end
    reached = GAP.reach_in_state_arrow(changed, state, ["user"])
    assert reached.to_pylist() == state.slice(0, 1).to_pylist()
    bridge = _table([("a", 100, 150)])  # [100, 310): reaches a's second through a's first? no: starts after 60
    assert GAP.reach_in_state_arrow(bridge, state, ["user"]).to_pylist() == state.slice(1, 1).to_pylist()
