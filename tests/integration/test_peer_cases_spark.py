"""Apache Spark's own session-window cases, as this product's stream and batch path answer them.

``StreamingSessionWindowSuite`` (sql/core, streaming): each ``AddData`` is one landing file, so one mini-batch
(``max_files_per_batch: 1``); each case is a pipeline of its own, and the four cases stream at once (as in
``tests/integration/test_peer_cases.py``). Its lines are split into words at landing, as the suite's
``explode(split(value, ' '))`` does, so one file holds a row per word. Gap 10 s, watermark 30 s, as the suite's
queries declare. Its timestamps are seconds since the epoch; here second ``s`` is 2024-03-01 00:00:00 UTC + ``s``
(one ``event_date``), and rows are printed back in Spark's seconds. The product serves the latest value of every
session (Spark's complete output), so the served table after the last batch is compared with Spark's final state;
for append mode that is the sessions Spark emitted plus the ones still open (its comments list them), which the
product serves too. Ported:

- ``complete mode - session window`` and ``- multiple col key`` (the key ``((w, w), w)`` as three string columns);
- ``append mode - session window``: its late event (second 0, at the watermark 11) is dropped by both, Spark's
  rule and ours agree (the session [0, 10) ends before the watermark); after the day's batch combine + reduce the
  table equals DuckDB over all rows, the late words' sessions included;
- ``session window - with more aggregation functions and UDAFs``: ``mean`` as ``avg``, ``median`` as
  ``approx_percentile`` (q 0.5), the suite's summing UDAF as ``spark_jobs.aggregates.examples:VectorSum``.

``DataFrameSessionWindowingSuite`` (sql/core, batch): each case's rows are one landing day (2016-03-27, the
suite's wall-clock times read as UTC: sessions of seconds, so the suite's session time zone changes no row),
then ``combine`` + ``reduce``; ``counts`` is ``count`` and ``sum`` is ``sum``. A projection
(``select(session_window(...), value)``, no grouping) gives every row its own window: grouped here by ``value``
(unique in those cases), each session holds one row, the same rows. Ported: ``simple session window with record at
window start``, ``session window groupBy statement``, ``... with multiple keys statement``, ``... keys overlapped
with sessions``, ``session window with multi-column projection`` with ``time window in SQL with single string
expression`` (same rows, same answer), ``session window combined with explode expression`` (exploded at
landing), ``null timestamps`` (the NULL-time rows go to ``dead_letter`` here) and ``SPARK-36724`` (its
``timestamp_ntz`` rows as ``timestamp``: the spec has no NTZ type). ``SPARK-36465: filter out events with invalid
gap duration``: Spark filters every row out, the spec refuses the gap (shown by a test).

Left out, and why:

- dynamic gap durations (``SPARK-36465`` in both suites, ``dynamic gap duration - nested tuple key`` and
  ``- multiple col key``, the SQL UDF and ``CASE`` gaps, ``Unsupported dynamic gap datatype``): the spec's gap is
  one duration;
- ``complete mode - session window - nested tuple key``: a struct key cannot be declared; flattened, its rows are
  those of the multiple col key case, which is ported;
- ``complete/append mode - session window - no key`` and ``update mode - session window`` (``- no key``): Spark
  refuses the query (global session aggregation, update output mode), so there is no row to compare; the product
  serves sessions over all rows (``group_by: []``, ported in the batch cases) and always serves the latest values;
- ``stdDevTime`` and ``varTime`` of the UDAF case: no such aggregate (a user-defined one would be ours, not
  Spark's); ``first``/``last`` of a struct: Spark does not assert them (non-deterministic);
- the state store providers, ``spark.sql.streaming.sessionWindow.merge.sessions.in.local.partition`` and the
  ``numRowsDroppedByWatermark`` metric: Spark-only (the late rows are counted as ``rows_late`` instead);
- ``... one distinct`` and ``... two distinct``: no ``sum_distinct`` aggregate;
- ``aliased session windows`` (an alias of the window column), ``multiple session windows in a single operator``
  (an analysis error), ``SPARK-38227`` (nullability of the window struct), ``SPARK-38349`` (the plan's filter)
  and ``SPARK-49836`` (a session window over another window aggregation's output): Spark API and plan matters,
  or nested aggregations the spec cannot declare.
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
import yaml

from spark_jobs.errors import SpecError
from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables
from spark_jobs.spec import PipelineSpec, load_spec, parse_spec
from spark_jobs.stream import query as stream
from spark_jobs.stream.query import StreamSummary
from tests.helpers import at_once
from tests.integration.test_stream import land
from tests.oracle import actual, assert_matches, expected, read_landing

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

DAY = "2024-03-01"
T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)  # the streaming suite's second 0
GAP = {"gap": "10 seconds"}
STREAM = {"max_files_per_batch": 1, "watermark": "30 seconds"}
COUNT: list[dict[str, Any]] = [{"name": "cnt", "fn": "count"}]

# StreamingSessionWindowSuite's sessionWindowQuery input: one list per AddData of (line, event second)
ADD_DATA: list[list[tuple[str, int]]] = [
    [("hello world spark streaming", 40), ("world hello structured streaming", 41)],
    [("spark streaming", 25)],  # placing new sessions "before" previous sessions
    [("spark streaming", 0)],  # append mode only: late, its session [0, 10) ends before the watermark 11
    [("spark streaming", 30)],  # concatenating multiple previous sessions into one
    [("hello apache spark", 60)],  # placing new sessions after previous sessions
    [("structured streaming", 90)],
]
LATE_BATCH = 2
COMPLETE_ADD_DATA = [lines for i, lines in enumerate(ADD_DATA) if i != LATE_BATCH]  # the complete-mode case's
# "complete mode - session window", its last CheckNewAnswer: (sessionId, start, end, durationMs, numEvents)
COMPLETE_FINAL: list[tuple[Any, ...]] = [
    ("spark", 25, 50, 25, 3), ("streaming", 25, 51, 26, 4), ("hello", 40, 51, 11, 2), ("world", 40, 51, 11, 2),
    ("structured", 41, 51, 10, 1), ("hello", 60, 70, 10, 1), ("apache", 60, 70, 10, 1), ("spark", 60, 70, 10, 1),
    ("structured", 90, 100, 10, 1), ("streaming", 90, 100, 10, 1),
]
# "append mode - session window": its last CheckNewAnswer emits these (closed by the watermark 60) ...
APPEND_EMITTED = COMPLETE_FINAL[:5]
# ... and its last comment's "current sessions" are still open: the product serves them too
APPEND_OPEN = COMPLETE_FINAL[5:]
# the late event's words: dropped by Spark and by the stream, counted by the day's batch combine
LATE_SESSIONS: list[tuple[Any, ...]] = [("spark", 0, 10, 10, 1), ("streaming", 0, 10, 10, 1)]
# the suite's keys: sessionId; for the multiple col key, aggKeyDouble (word, word) and aggKeySingle (word)
KEYS = {"single": ["session_id"], "multi_col": ["agg_key_double_1", "agg_key_double_2", "agg_key_single"]}


def _raw(root: Path, group_by: list[str], schema: dict[str, str], aggregates: list[dict[str, Any]],
         window: dict[str, str] = GAP) -> dict[str, Any]:
    return {"name": "spark_peer", "lake": str(root / "lake"), "group_by": group_by, "window": window,
            "source": {"path": str(root / "landing"), "format": "parquet", "event_time": "event_time",
                       "schema": {"event_time": "timestamp", **schema}},
            "aggregates": aggregates}


def _spec(root: Path, group_by: list[str], schema: dict[str, str], aggregates: list[dict[str, Any]],
          stream_conf: dict[str, Any] | None = None) -> PipelineSpec:
    raw = _raw(root, group_by, schema, aggregates) | ({"stream": stream_conf} if stream_conf else {})
    (root / "spark_peer.yaml").write_text(yaml.safe_dump(raw))
    return load_spec(root / "spark_peer.yaml")


def _times(values: list[dt.datetime | None]) -> pa.Array:
    return pa.array(values, pa.timestamp("us", tz="UTC"))


def _word_rows(lines: list[tuple[str, int]], keys: list[str]) -> pa.Table:
    """One AddData: a row per word (every key column holds the word), at its line's second."""
    words = [(word, second) for line, second in lines for word in line.split(" ")]
    columns = {"event_time": _times([T0 + dt.timedelta(seconds=s) for _, s in words])}
    return pa.table(columns | {k: pa.array([w for w, _ in words], pa.string()) for k in keys})


def _word_spec(root: Path, batches: list[list[tuple[str, int]]], keys: list[str]) -> PipelineSpec:
    """A pipeline over the suite's words, its ``AddData`` landed, one file each."""
    spec = _spec(root, keys, dict.fromkeys(keys, "string"), COUNT, STREAM)
    for lines in batches:
        land(root / "landing", DAY, _word_rows(lines, keys))
    return spec


def _stream(spark: SparkSession, spec: PipelineSpec) -> tuple[PipelineSpec, StreamSummary]:
    return spec, stream.run(spark, spec, available_now=True)


def _served(spec: PipelineSpec) -> list[dict[str, Any]]:
    return actual(PipelineTables(spec.lake, spec.name).aggregates, spec).to_dict("records")


def _seconds(t: Any) -> int:
    return int((t - T0).total_seconds())


def _spark_sessions(spec: PipelineSpec) -> list[tuple[Any, ...]]:
    """The served sessions as the streaming suite selects them: keys, start, end, durationMs, numEvents."""
    out = []
    for r in _served(spec):
        start, end = _seconds(r["window_start"]), _seconds(r["window_end"])
        out.append((*(r[k] for k in spec.group_by), start, end, end - start, r["cnt"]))
    return sorted(out)


def _keyed(rows: list[tuple[Any, ...]], key: str) -> list[tuple[Any, ...]]:
    """Spark's rows with the word as the case's key: ((w, w), w, ...) flattened for the multiple col key."""
    return sorted((row[0],) * len(KEYS[key]) + row[1:] for row in rows)


@pytest.mark.parametrize("key", ["single", "multi_col"])
def test_spark_complete_mode_session_window_serves_sparks_final_sessions(suite_streams, key):
    spec, summary = suite_streams[f"complete_{key}"].result()
    assert len(summary.batches) == len(COMPLETE_ADD_DATA)
    assert _spark_sessions(spec) == _keyed(COMPLETE_FINAL, key)
    assert sum(b.rows_late for b in summary.batches) == 0  # under the watermark 30 s too, no row is late


def test_spark_append_mode_session_window_drops_the_late_event_and_the_days_batch_counts_it(spark, suite_streams):
    spec, summary = suite_streams["append"].result()
    assert len(summary.batches) == len(ADD_DATA)
    assert summary.batches[LATE_BATCH].watermark == T0 + dt.timedelta(seconds=11)  # the suite's "watermark: 11"
    # its two words are dropped, as the suite's assertNumRowsDroppedByWatermark(2) says
    assert [b.rows_late for b in summary.batches] == [2 if i == LATE_BATCH else 0 for i in range(len(ADD_DATA))]
    assert _spark_sessions(spec) == sorted(APPEND_EMITTED + APPEND_OPEN)
    # by design, the day's batch combine then counts every row: DuckDB over all rows, the late words included
    combine.run(spark, spec, DAY)
    reduce.run(spark, spec)
    assert_matches(actual(PipelineTables(spec.lake, spec.name).aggregates, spec),
                   expected(read_landing(spec.source.path), spec), spec)
    assert _spark_sessions(spec) == sorted(APPEND_EMITTED + APPEND_OPEN + LATE_SESSIONS)


# "session window - with more aggregation functions and UDAFs": one AddData per (sessionId, second)
UDAF_ADD_DATA = [("a", 41), ("a", 42), ("a", 40), ("b", 100), ("b", 101)]
UDAF_AGGREGATES: list[dict[str, Any]] = [{"name": "mean_time", "fn": "avg", "column": "single"},
                   {"name": "median_time", "fn": "approx_percentile", "column": "single", "args": {"q": 0.5}},
                   {"name": "my_sum_single", "fn": "spark_jobs.aggregates.examples:VectorSum", "columns": ["single"]}]
# its CheckAnswer (sessionId, start, end, CAST(meanTime AS LONG), CAST(medianTime AS LONG), mySumSingle), without
# stdDevTime and varTime (1, 1)
SPARK_UDAF_ROW = ("a", 40, 52, 41, 41, 123)


def _udaf_spec(root: Path) -> PipelineSpec:
    spec = _spec(root, ["session_id"], {"session_id": "string", "single": "long"}, UDAF_AGGREGATES, STREAM)
    for word, second in UDAF_ADD_DATA:  # single is the event's second, as the suite's "single" column
        land(root / "landing", DAY, pa.table({"event_time": _times([T0 + dt.timedelta(seconds=second)]),
                                              "session_id": [word], "single": pa.array([second], pa.int64())}))
    return spec


@pytest.fixture(scope="module")
def suite_streams(spark: SparkSession,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future[tuple[PipelineSpec, StreamSummary]]]:
    """The suite's four streamed cases, each a pipeline (its own landing files and lake), streamed at once."""
    specs = {f"complete_{key}": _word_spec(tmp_path_factory.mktemp(f"complete_{key}"), COMPLETE_ADD_DATA, KEYS[key])
             for key in KEYS}
    specs["append"] = _word_spec(tmp_path_factory.mktemp("append"), ADD_DATA, KEYS["single"])
    specs["udaf"] = _udaf_spec(tmp_path_factory.mktemp("udaf"))
    return at_once(spark, {name: partial(_stream, spec=spec) for name, spec in specs.items()})


def test_spark_session_window_mean_median_and_a_udaf_sum_equal_sparks(suite_streams):
    spec, summary = suite_streams["udaf"].result()
    assert len(summary.batches) == len(UDAF_ADD_DATA)
    rows = {r["session_id"]: (r["session_id"], _seconds(r["window_start"]), _seconds(r["window_end"]),
                              int(r["mean_time"]), int(r["median_time"]), r["my_sum_single"]) for r in _served(spec)}
    assert rows["a"] == SPARK_UDAF_ROW
    # b's session is still open, so Spark's append mode has not emitted it; the product serves it: mean 100.5,
    # a median from its input (Spark's median 100.5 casts to 100), sum 201
    assert rows["b"] == ("b", 100, 111, 100, 100, 201)
    assert sorted(rows) == ["a", "b"]


@dataclass(frozen=True)
class FrameCase:
    """One DataFrameSessionWindowingSuite case: its rows (time, value, id), keys, selected columns and answer."""

    rows: tuple[tuple[str | None, int, str | None], ...]
    group_by: tuple[str, ...]
    select: tuple[str, ...]  # start, end (as Spark casts them to string), a group key, cnt (counts), total (sum)
    want: tuple[tuple[Any, ...], ...]  # Spark's rows, ordered by session start as its queries order them
    rejects: int = 0


FRAME_DAY = "2016-03-27"
THREE_ROWS = (("2016-03-27 19:39:34", 1, "a"), ("2016-03-27 19:39:56", 2, "a"), ("2016-03-27 19:39:27", 4, "b"))
FOUR_A_ONE_B = (("2016-03-27 19:39:34", 1, "a"), ("2016-03-27 19:39:39", 1, "a"), ("2016-03-27 19:39:56", 2, "a"),
                ("2016-03-27 19:40:04", 2, "a"), ("2016-03-27 19:39:27", 4, "b"))
FRAME_CASES = {
    "simple_session_window_with_record_at_window_start": FrameCase(
        (("2016-03-27 19:39:30", 1, "a"),), (), ("start", "end", "cnt"),
        (("2016-03-27 19:39:30", "2016-03-27 19:39:40", 1),)),
    "session_window_group_by_statement": FrameCase(THREE_ROWS, (), ("cnt",), ((2,), (1,))),
    "group_by_with_multiple_keys_statement": FrameCase(
        FOUR_A_ONE_B, ("id",), ("start", "end", "id", "cnt", "total"),
        (("2016-03-27 19:39:27", "2016-03-27 19:39:37", "b", 1, 4),
         ("2016-03-27 19:39:34", "2016-03-27 19:39:49", "a", 2, 2),
         ("2016-03-27 19:39:56", "2016-03-27 19:40:14", "a", 2, 4))),
    "multiple_keys_overlapped_with_sessions": FrameCase(
        (("2016-03-27 19:39:34", 1, "a"), ("2016-03-27 19:39:39", 1, "b"), ("2016-03-27 19:39:40", 2, "a"),
         ("2016-03-27 19:39:45", 2, "b"), ("2016-03-27 19:39:27", 4, "b")), ("id",),
        ("start", "end", "id", "cnt", "total"),
        (("2016-03-27 19:39:27", "2016-03-27 19:39:37", "b", 1, 4),
         ("2016-03-27 19:39:34", "2016-03-27 19:39:50", "a", 2, 3),
         ("2016-03-27 19:39:39", "2016-03-27 19:39:55", "b", 2, 3))),
    "multi_column_projection_and_sql_single_string_expression": FrameCase(
        THREE_ROWS, ("value",), ("start", "end", "value"),
        (("2016-03-27 19:39:27", "2016-03-27 19:39:37", 4), ("2016-03-27 19:39:34", "2016-03-27 19:39:44", 1),
         ("2016-03-27 19:39:56", "2016-03-27 19:40:06", 2))),
    "combined_with_explode_expression": FrameCase(  # ids Seq("a", "b") and Seq("a", "c", "d"), exploded
        tuple(("2016-03-27 19:39:34", 1, i) for i in "ab") + tuple(("2016-03-27 19:39:56", 2, i) for i in "acd"),
        ("value", "id"), ("value",), ((1,), (1,), (2,), (2,), (2,))),
    "null_timestamps": FrameCase(  # Spark drops the NULL-time rows; here they go to dead_letter
        (("2016-03-27 09:00:05", 1, None), ("2016-03-27 09:00:32", 2, None), (None, 3, None), (None, 4, None)),
        ("value",), ("value",), ((1,), (2,)), rejects=2),
    "spark_36724_timestamp_ntz_rows": FrameCase(
        (("2016-03-27 19:39:30", 1, "a"), ("2016-03-27 19:39:25", 2, "a")), (), ("start", "end", "cnt"),
        (("2016-03-27 19:39:25", "2016-03-27 19:39:40", 2),)),
}
FRAME_AGGREGATES: list[dict[str, Any]] = [{"name": "cnt", "fn": "count"}, {"name": "total", "fn": "sum", "column": "value"}]


def _frame_table(rows: tuple[tuple[str | None, int, str | None], ...]) -> pa.Table:
    times = [None if t is None else dt.datetime.fromisoformat(t).replace(tzinfo=dt.UTC) for t, _, _ in rows]
    return pa.table({"event_time": _times(times), "value": pa.array([v for _, v, _ in rows], pa.int64()),
                     "id": pa.array([i for _, _, i in rows], pa.string())})


def _as_spark_selects(spec: PipelineSpec, select: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """The served sessions ordered by start, with Spark's selected columns (times cast to string as Spark's)."""
    def text(t: Any) -> str:
        return t.strftime("%Y-%m-%d %H:%M:%S")

    rows = sorted(_served(spec), key=lambda r: (r["window_start"], *(str(r[k]) for k in spec.group_by)))
    columns = {"start": lambda r: text(r["window_start"]), "end": lambda r: text(r["window_end"])}
    return [tuple(columns[c](r) if c in columns else r[c] for c in select) for r in rows]


@pytest.mark.parametrize("case", list(FRAME_CASES))
def test_spark_dataframe_session_windowing_case_equals_sparks_rows(spark, tmp_path, case):
    c = FRAME_CASES[case]
    spec = _spec(tmp_path, list(c.group_by), {"value": "long", "id": "string"}, FRAME_AGGREGATES)
    land(tmp_path / "landing", FRAME_DAY, _frame_table(c.rows))
    assert combine.run(spark, spec, FRAME_DAY).rows_rejected == c.rejects
    reduce.run(spark, spec)
    assert _as_spark_selects(spec, c.select) == list(c.want)


def test_spark_invalid_gap_duration_is_refused_where_spark_filters_every_row(tmp_path):
    """SPARK-36465's ``session_window($"time", "x sec")`` answers no rows; the spec names the bad gap instead."""
    with pytest.raises(SpecError, match=r"window\.gap: bad duration 'x sec'"):
        parse_spec(_raw(tmp_path, [], {"value": "long"}, COUNT, window={"gap": "x sec"}))
