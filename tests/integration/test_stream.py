"""The streaming job on real Spark Structured Streaming and real Delta tables.

Landing files get increasing modification times, so the file source hands them out in a
known order; ``max_files_per_batch`` then fixes what each mini-batch holds.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import DeltaTable
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from spark_jobs._failpoints import once_at
from spark_jobs.errors import InputError, LakeError, PipelineError
from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables
from spark_jobs.spec import PipelineSpec, load_spec
from spark_jobs.stream import query as stream
from tests.builders import ALL_AGGREGATES, FAST_AGGREGATES, day_events, events, make_spec
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
_mtime = [1_700_000_000]


def land(landing: Path, date: str, table: pa.Table, name: str | None = None) -> Path:
    """Write one landing file, newer than every file written before it."""
    part = landing / f"event_date={date}"
    part.mkdir(parents=True, exist_ok=True)
    path = part / (name or f"f{_mtime[0]}.parquet")
    pq.write_table(table, path)
    _mtime[0] += 10
    os.utime(path, (_mtime[0], _mtime[0]))
    return path


def land_sliced(landing: Path, date: str, table: pa.Table, files: int) -> None:
    """A day's rows in ``files`` files, in event-time order (as a live source lands them)."""
    table = table.sort_by("event_time")
    step = -(-table.num_rows // files)
    for i in range(files):
        land(landing, date, table.slice(i * step, step))


def with_stream(spec: PipelineSpec, **stream_conf: Any) -> PipelineSpec:
    path = Path(spec.origin)
    raw = yaml.safe_load(path.read_text())
    raw["stream"] = stream_conf
    path.write_text(yaml.safe_dump(raw))
    return load_spec(path)


def scores_spec(root: Path, **stream_conf: Any) -> PipelineSpec:
    raw = {"name": "scores", "lake": str(root / "lake"), "group_by": ["name"],
           "source": {"path": str(root / "landing"), "format": "parquet", "event_time": "at",
                      "schema": {"at": "timestamp", "name": "string", "score": "long"}},
           "aggregates": [{"name": "cnt", "fn": "count"}], "stream": stream_conf}
    (root / "scores.yaml").write_text(yaml.safe_dump(raw))
    return load_spec(root / "scores.yaml")


def scores(rows: list[tuple[str, int]], start: int = 0) -> pa.Table:
    at = [T0 + dt.timedelta(minutes=start + i) for i in range(len(rows))]
    return pa.table({"at": pa.array(at, pa.timestamp("us", tz="UTC")), "name": [r[0] for r in rows],
                     "score": pa.array([r[1] for r in rows], pa.int64())})


def changelog(spec: PipelineSpec) -> pd.DataFrame:
    return DeltaTable(PipelineTables(spec.lake, spec.name).changelog).to_pandas().sort_values(
        ["batch_id", "seq"]).reset_index(drop=True)


def flink_text(df: pd.DataFrame) -> str:
    return " ".join(f"{r.op}[{r.name},{r.cnt}]" for r in df.itertuples())


TOM_JOHN = [("Tom", 12), ("John", 15), ("Tom", 18), ("Tom", 19)]


def test_one_row_per_mini_batch_gives_flinks_retraction_changelog(spark, tmp_path):
    spec = scores_spec(tmp_path, max_files_per_batch=1)
    for i, row in enumerate(TOM_JOHN):
        land(tmp_path / "landing", "2024-03-01", scores([row], start=i))
    summary = stream.run(spark, spec, available_now=True)
    assert len(summary.batches) == 4
    log = changelog(spec)
    assert flink_text(log) == "+I[Tom,1] +I[John,1] -U[Tom,1] +U[Tom,2] -U[Tom,2] +U[Tom,3]"
    assert list(log["batch_id"]) == [0, 1, 2, 2, 3, 3] and list(log["seq"]) == [0, 0, 0, 1, 0, 1]
    agg = DeltaTable(PipelineTables(spec.lake, spec.name).aggregates).to_pandas().sort_values("name")
    assert list(zip(agg["name"], agg["cnt"], strict=True)) == [("John", 1), ("Tom", 3)]


def test_all_rows_in_one_mini_batch_emit_only_the_final_values(spark, tmp_path):
    spec = scores_spec(tmp_path, max_files_per_batch=10)
    land(tmp_path / "landing", "2024-03-01", scores(TOM_JOHN))
    stream.run(spark, spec, available_now=True)
    assert flink_text(changelog(spec)) == "+I[Tom,3] +I[John,1]"
    # one state write per key for the batch, not one per row
    state = DeltaTable(PipelineTables(spec.lake, spec.name).stream_state).to_pandas()
    assert sorted(zip(state["name"], state["n_rows"], strict=True)) == [("John", 1), ("Tom", 3)]


def test_a_rerun_finds_nothing_new_and_changes_nothing(spark, tmp_path):
    spec = scores_spec(tmp_path, max_files_per_batch=1)
    land(tmp_path / "landing", "2024-03-01", scores(TOM_JOHN[:2]))
    stream.run(spark, spec, available_now=True)
    tables = PipelineTables(spec.lake, spec.name)
    versions = {p: DeltaTable(p).version() for p in (tables.changelog, tables.aggregates, tables.partials)}
    assert stream.run(spark, spec, available_now=True).batches == []
    assert {p: DeltaTable(p).version() for p in versions} == versions
    land(tmp_path / "landing", "2024-03-01", scores([("Tom", 1)], start=5))
    stream.run(spark, spec, available_now=True)
    assert flink_text(changelog(spec)) == "+I[Tom,1] +I[John,1] -U[Tom,1] +U[Tom,2]"


def test_a_handed_off_batch_whose_commit_fails_fails_the_stream_and_a_restart_commits_it(spark, tmp_path):
    """Batch 0 comes to the driver and is handed off; its changelog commit fails on the commit thread while
    Spark reads batch 1. The stream fails with that error, and a restart commits batch 0 from its record."""
    spec = scores_spec(tmp_path, max_files_per_batch=1)
    for i, row in enumerate(TOM_JOHN):
        land(tmp_path / "landing", "2024-03-01", scores([row], start=i))

    def disk_full() -> None:
        raise OSError("No space left on device")

    with once_at("commit:changelog:before", disk_full) as ran, pytest.raises(PipelineError, match="No space left"):
        stream.run(spark, spec, available_now=True)
    assert ran()
    tables = PipelineTables(spec.lake, spec.name)
    handoff = Path(tables.stream_checkpoint) / "handoff"
    assert [p.name for p in handoff.glob("*.json")] == ["0.json"]
    assert DeltaTable(tables.aggregates).transaction_version("scores.stream") == 0  # committed before the failure
    assert not DeltaTable.is_deltatable(tables.changelog)
    summary = stream.run(spark, spec, available_now=True)
    assert flink_text(changelog(spec)) == "+I[Tom,1] +I[John,1] -U[Tom,1] +U[Tom,2] -U[Tom,2] +U[Tom,3]"
    assert not list(handoff.glob("*.json"))
    assert [b.batch_id for b in summary.batches if not b.replayed] == [0, 1, 2, 3]


def test_windowed_stream_equals_the_batch_path_and_the_oracle(spark, tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "b").mkdir()
    spec = make_spec(tmp_path / "s", window={"size": "1 hour"}, aggregates=ALL_AGGREGATES)
    spec = with_stream(spec, max_files_per_batch=2, watermark="1 day")
    batch_spec = make_spec(tmp_path / "b", window={"size": "1 hour"}, aggregates=ALL_AGGREGATES)
    for date in ("2024-03-01", "2024-03-02"):
        day = day_events(date, 300, seed=3, rejected=2)
        land_sliced(tmp_path / "s" / "landing", date, day, files=3)
        land_sliced(tmp_path / "b" / "landing", date, day, files=3)
    summary = stream.run(spark, spec, available_now=True)
    assert len(summary.batches) == 3
    assert sum(b.rows_rejected for b in summary.batches) == 4
    tables = PipelineTables(spec.lake, spec.name)
    got = actual(tables.aggregates, spec)
    assert_matches(got, expected(read_landing(tmp_path / "s" / "landing"), spec), spec)
    for date in ("2024-03-01", "2024-03-02"):
        combine.run(spark, batch_spec, date)
    reduce.run(spark, batch_spec)
    batch = actual(PipelineTables(batch_spec.lake, batch_spec.name).aggregates, batch_spec)
    values = [*spec.key_columns, "n_rows", *(a.name for a in spec.aggregates)]
    pd.testing.assert_frame_equal(got[values], batch[values])
    # applying the changelog in order rebuilds the streamed values
    applied: dict[tuple[Any, ...], Any] = {}
    for row in changelog(spec).itertuples():
        key = (row.page, row.window_start)
        if row.op in ("+I", "+U"):
            applied[key] = row.views
        else:
            applied.pop(key, None)
    assert applied == {(r.page, r.window_start): r.views for r in got.itertuples()}
    dead = DeltaTable(tables.dead_letter).to_pandas()
    assert len(dead) == 4 and set(dead["job"]) == {"stream"}
    runs = DeltaTable(tables.runs).to_pandas()
    assert (runs["rows_in"] == runs["rows_aggregated"] + runs["rows_rejected"]).all()


def test_late_rows_go_to_dead_letter_and_closed_windows_leave_state(spark, tmp_path):
    spec = with_stream(make_spec(tmp_path, window={"size": "1 hour"}, aggregates=FAST_AGGREGATES),
                       max_files_per_batch=1, watermark="10 minutes")
    landing, date = tmp_path / "landing", "2024-03-01"

    def at(hour: int, minute: int) -> dt.datetime:
        return T0.replace(hour=hour, minute=minute)

    land(landing, date, events([(at(0, 5), "u1", "/a", 10, 1.0, "DE"), (at(0, 40), "u2", "/b", 20, 1.0, "DE")]))
    land(landing, date, events([(at(3, 0), "u1", "/a", 30, 1.0, "DE")]))
    land(landing, date, events([(at(0, 20), "u3", "/a", 40, 1.0, "DE"),    # late: older than 02:50
                                (at(2, 55), "u3", "/c", 50, 1.0, "DE")]))  # in time
    summary = stream.run(spark, spec, available_now=True)
    assert [b.rows_late for b in summary.batches] == [0, 0, 1]
    assert summary.batches[2].watermark == at(2, 50)
    tables = PipelineTables(spec.lake, spec.name)
    dead = DeltaTable(tables.dead_letter).to_pandas()
    assert len(dead) == 1 and dead["reason"][0].startswith("late: 2024-03-01 00:20:00")
    # the 00:00 window closed at watermark 02:50: its state is gone, its value stays served
    state = DeltaTable(tables.stream_state).to_pandas()
    assert sorted(state["window_start"].dt.hour) == [2, 3]
    agg = actual(tables.aggregates, spec)
    assert sorted(zip(agg["page"], agg["window_start"].dt.hour, agg["views"], strict=True)) == [
        ("/a", 0, 1), ("/a", 3, 1), ("/b", 0, 1), ("/c", 2, 1)]
    # the batch combine of the day counts the late row, and supersedes the stream (hybrid rule)
    combine.run(spark, spec, date)
    reduce.run(spark, spec)
    agg = actual(tables.aggregates, spec)
    views = {(p, w.hour): v for p, w, v in zip(agg["page"], agg["window_start"], agg["views"], strict=True)}
    assert views[("/a", 0)] == 2
    assert_matches(agg, expected(read_landing(landing), spec), spec)


@pytest.mark.parametrize("window", [{"size": "1 hour", "slide": "20 minutes"}, {"gap": "10 minutes"}, None],
                         ids=["hopping", "sessions", "unwindowed"])
@pytest.mark.parametrize("engine", ["driver", "spark"])
def test_rejects_ride_the_one_pass_into_dead_letter_once_each_as_the_combine_records_them(spark, tmp_path, window,
                                                                                         engine):
    """Rejects are groups of their own in the pre-aggregation: a hopping window's copies of a row, a session's
    neighbours and identical bad rows must still give one dead letter per rejected row, with the record the
    batch combine writes for it."""
    spec = with_stream(make_spec(tmp_path, window=window, aggregates=FAST_AGGREGATES, null_keys="reject"),
                       max_files_per_batch=2)
    landing, date = tmp_path / "landing", "2024-03-01"
    bad = [(None, "u2", "/b", 5, 1.0, "DE"), (T0.replace(hour=2), "u3", None, 7, 1.0, "DE"),
           (T0 + dt.timedelta(days=1, hours=1), "u4", "/a", 1, 1.0, "DE")]
    good = [(T0.replace(hour=1, minute=m), f"u{m}", "/a", m, 1.0, "DE") for m in (5, 25)]
    land(landing, date, events([good[0], *bad, bad[0]]))  # one bad row twice
    land(landing, date, events([good[1], bad[1]]))
    summary = stream.run(spark, spec, available_now=True, driver_max_keys=0 if engine == "spark" else 1000)
    assert [b.on_driver for b in summary.batches] == [engine == "driver"]
    assert (summary.batches[0].rows_in, summary.batches[0].rows_rejected) == (7, 5)
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(landing), spec), spec)
    combine.run(spark, spec, date)
    dead = DeltaTable(tables.dead_letter).to_pandas()
    by_job = {job: sorted(zip(rows["reason"], rows["raw"], rows["source_file"], strict=True))
              for job, rows in dead.groupby("job")}
    assert len(by_job["stream"]) == 5 and by_job["stream"] == by_job["combine"]


@pytest.mark.parametrize("order", ["stream_then_batch", "batch_then_stream"])
def test_stream_and_batch_of_one_day_give_the_same_aggregates_in_either_order(spark, tmp_path, order):
    spec = with_stream(make_spec(tmp_path, window={"size": "1 hour"}, aggregates=FAST_AGGREGATES),
                       max_files_per_batch=1, watermark="1 day")
    land_sliced(tmp_path / "landing", "2024-03-01", day_events("2024-03-01", 200, seed=5), files=2)
    if order == "stream_then_batch":
        stream.run(spark, spec, available_now=True)
        combine.run(spark, spec, "2024-03-01")
        reduce.run(spark, spec)
    else:
        combine.run(spark, spec, "2024-03-01")
        reduce.run(spark, spec)
        stream.run(spark, spec, available_now=True)
        reduce.run(spark, spec)
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(tmp_path / "landing"), spec), spec)
    # the stream's partials are kept, but a day with batch partials counts those only
    parts = DeltaTable(tables.partials).to_pandas()
    assert set(parts["source"]) == {"batch", "stream"}


def test_json_landing_rejects_malformed_lines_into_dead_letter(spark, tmp_path):
    spec = make_spec(tmp_path, window={"size": "1 hour"}, aggregates=FAST_AGGREGATES, fmt="json")
    part = tmp_path / "landing" / "event_date=2024-03-01"
    part.mkdir(parents=True)
    (part / "a.json").write_text(
        '{"event_time": "2024-03-01T01:00:00Z", "user_id": "u1", "page": "/a", "duration_ms": 5}\n'
        '{"event_time": "2024-03-01T01:10:00Z", "user_id": "u2", "page": "/a", "duration_ms": "x"}\n'
        'not json at all\n'
        '{"event_time": "2024-03-02T01:00:00Z", "user_id": "u3", "page": "/b", "duration_ms": 7}\n')
    summary = stream.run(spark, spec, available_now=True)
    assert (summary.batches[0].rows_in, summary.batches[0].rows_rejected) == (4, 3)
    dead = DeltaTable(PipelineTables(spec.lake, spec.name).dead_letter).to_pandas().sort_values("reason")
    assert [r.split(":")[0] for r in dead["reason"]] == ["duration_ms", "event_time 2024-03-02 01", "malformed record"]


def test_missing_landing_directory_is_a_clear_input_error(spark, tmp_path):
    spec = scores_spec(tmp_path)
    with pytest.raises(InputError, match=r"landing directory .* does not exist"):
        stream.run(spark, spec, available_now=True)


def test_state_without_its_checkpoint_is_refused(spark, tmp_path):
    import shutil

    spec = scores_spec(tmp_path)
    land(tmp_path / "landing", "2024-03-01", scores(TOM_JOHN))
    stream.run(spark, spec, available_now=True)
    shutil.rmtree(PipelineTables(spec.lake, spec.name).stream_checkpoint)
    with pytest.raises(LakeError, match=r"checkpoint .* is missing"):
        stream.run(spark, spec, available_now=True)


# ------------------------------------------------------------------ changelog (CDC) input
def cdc_spec(root: Path, *, udaf: bool = True, **stream_conf: Any) -> PipelineSpec:
    raw = {"name": "cdc", "lake": str(root / "lake"), "group_by": ["name"],
           "source": {"path": str(root / "landing"), "format": "parquet", "event_time": "at", "op_column": "op",
                      "schema": {"at": "timestamp", "op": "string", "name": "string", "score": "long",
                                 "weight": "double"}},
           "aggregates": [{"name": "cnt", "fn": "count"}, {"name": "total", "fn": "sum", "column": "score"},
                          {"name": "avg_score", "fn": "avg", "column": "score"},
                          {"name": "low", "fn": "min", "column": "score"},
                          {"name": "high", "fn": "max", "column": "score"},
                          *([{"name": "wavg", "fn": "spark_jobs.aggregates.examples:WeightedAvg",
                              "columns": ["score", "weight"]}] if udaf else [])],
           "stream": stream_conf}
    (root / "cdc.yaml").write_text(yaml.safe_dump(raw))
    return load_spec(root / "cdc.yaml")


def cdc_rows(rows: list[tuple[str, str, int]], start: int) -> pa.Table:
    at = [T0 + dt.timedelta(minutes=start + i) for i in range(len(rows))]
    return pa.table({"at": pa.array(at, pa.timestamp("us", tz="UTC")), "op": [r[0] for r in rows],
                     "name": [r[1] for r in rows], "score": pa.array([r[2] for r in rows], pa.int64()),
                     "weight": pa.array([1.0] * len(rows))})


CDC_BATCHES = [
    [("+I", "Tom", 10), ("+I", "John", 5)],
    [("-U", "Tom", 10), ("+U", "Tom", 20)],
    [("-D", "John", 5), ("+I", "Tom", 30)],
    [("-D", "Tom", 30), ("+I", "Ann", 7), ("-D", "Ann", 7), ("+I", "Ann", 8)],
]


def test_changelog_source_retracts_and_min_max_fall_back(spark, tmp_path):
    spec = cdc_spec(tmp_path, max_files_per_batch=1)
    for i, batch in enumerate(CDC_BATCHES):
        land(tmp_path / "landing", "2024-03-01", cdc_rows(batch, start=10 * i))
    stream.run(spark, spec, available_now=True)
    log = changelog(spec)
    got = [(r.batch_id, r.op, r.name, r.cnt, r.total, r.low, r.high) for r in log.itertuples()]
    assert got == [
        (0, "+I", "Tom", 1, 10, 10, 10), (0, "+I", "John", 1, 5, 5, 5),
        (1, "-U", "Tom", 1, 10, 10, 10), (1, "+U", "Tom", 1, 20, 20, 20),
        (2, "-D", "John", 1, 5, 5, 5), (2, "-U", "Tom", 1, 20, 20, 20), (2, "+U", "Tom", 2, 50, 20, 30),
        (3, "-U", "Tom", 2, 50, 20, 30), (3, "+U", "Tom", 1, 20, 20, 20), (3, "+I", "Ann", 1, 8, 8, 8),
    ]
    tables = PipelineTables(spec.lake, spec.name)
    agg = DeltaTable(tables.aggregates).to_pandas().sort_values("name")
    assert [(r.name, r.cnt, r.total, r.avg_score, r.low, r.high, r.wavg) for r in agg.itertuples()] == [
        ("Ann", 1, 8, 8.0, 8, 8, 8.0), ("Tom", 1, 20, 20.0, 20, 20, 20.0)]
    # the batch path over the same changelog lands on the same table (John deleted there too)
    combine.run(spark, spec, "2024-03-01")
    reduce.run(spark, spec)
    again = DeltaTable(tables.aggregates).to_pandas().sort_values("name")
    cols = ["name", "cnt", "total", "avg_score", "low", "high", "wavg"]
    pd.testing.assert_frame_equal(again[cols].reset_index(drop=True), agg[cols].reset_index(drop=True))


def test_changelog_source_rejects_unknown_change_kinds(spark, tmp_path):
    spec = cdc_spec(tmp_path, udaf=False)
    land(tmp_path / "landing", "2024-03-01", cdc_rows([("+I", "Tom", 1), ("*", "Tom", 2)], start=0))
    summary = stream.run(spark, spec, available_now=True)
    assert summary.batches[0].rows_rejected == 1
    dead = DeltaTable(PipelineTables(spec.lake, spec.name).dead_letter).to_pandas()
    assert dead["reason"][0] == "op: bad change kind *; use +I, -U, +U, -D"


# ------------------------------------------------------------------ property: any split into mini-batches
@st.composite
def split_days(draw: Any) -> tuple[list[pa.Table], int]:
    """Random events over two days, cut into 1-4 files in random order, and a mini-batch size in files."""
    n = draw(st.integers(1, 60))
    seconds = draw(st.lists(st.integers(0, 2 * 86_400 - 1), min_size=n, max_size=n))
    pages = draw(st.lists(st.sampled_from(["/a", "/b", "/c"]), min_size=n, max_size=n))
    ms = draw(st.lists(st.one_of(st.none(), st.integers(0, 100)), min_size=n, max_size=n))
    rows = [(T0 + dt.timedelta(seconds=s), "u1", p, m, 1.0, "DE") for s, p, m in zip(seconds, pages, ms, strict=True)]
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=3)))
    parts = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    return [events(p) for p in draw(st.permutations(parts)) if p], draw(st.integers(1, 3))


@settings(max_examples=4, deadline=None, derandomize=True, phases=[Phase.generate])
@given(split=split_days())
def test_any_split_into_mini_batches_equals_the_oracle(spark, tmp_path_factory, split):
    tables_in, files_per_batch = split
    root = tmp_path_factory.mktemp("split")
    spec = with_stream(make_spec(root, window={"size": "1 hour"}, aggregates=FAST_AGGREGATES),
                       max_files_per_batch=files_per_batch, watermark="3 days")
    for table in tables_in:
        for date in ("2024-03-01", "2024-03-02"):  # a file holds one day's rows, as landing partitions do
            day = table.filter(pc.equal(pc.strftime(table["event_time"], "%Y-%m-%d"), date))
            if day.num_rows:
                land(root / "landing", date, day)
    summary = stream.run(spark, spec, available_now=True)
    tables = PipelineTables(spec.lake, spec.name)
    got = actual(tables.aggregates, spec)
    assert_matches(got, expected(read_landing(root / "landing"), spec), spec)
    assert sum(b.state_writes for b in summary.batches) <= sum(b.rows_aggregated for b in summary.batches)

    def values(row: Any) -> tuple[int, int | None]:
        return int(row.views), None if pd.isna(row.total_ms) else int(row.total_ms)

    applied: dict[tuple[Any, ...], Any] = {}
    for row in changelog(spec).itertuples():
        key = (row.page, row.window_start)
        if row.op in ("+I", "+U"):
            applied[key] = values(row)
        else:
            assert applied.pop(key) == values(row)  # -U carries exactly the values it retracts
    assert applied == {(r.page, r.window_start): values(r) for r in got.itertuples()}


def test_maintenance_vacuums_the_streams_state_and_the_stream_goes_on(spark, tmp_path):
    from spark_jobs.lake.maintenance import maintain

    spec = scores_spec(tmp_path, max_files_per_batch=1)
    for i, row in enumerate(TOM_JOHN[:3]):
        land(tmp_path / "landing", "2024-03-01", scores([row], start=i))
    stream.run(spark, spec, available_now=True)
    state = PipelineTables(spec.lake, spec.name).stream_state
    report = {m.table: m for m in maintain(spec.lake, spec.name, retention_hours=0, enforce_retention=False)}
    assert report["stream_state"].vacuumed and report["stream_state"].checkpoint  # earlier states, rewritten since
    on_disk = {p.name for p in Path(state).glob("*.parquet")}
    assert on_disk == {Path(u).name for u in DeltaTable(state).file_uris()}
    land(tmp_path / "landing", "2024-03-01", scores([TOM_JOHN[3]], start=3))
    stream.run(spark, spec, available_now=True)
    assert flink_text(changelog(spec)) == "+I[Tom,1] +I[John,1] -U[Tom,1] +U[Tom,2] -U[Tom,2] +U[Tom,3]"


# ------------------------------------------------------------------ driver merge = Spark merge
def _plain(value: Any) -> Any:
    """A cell as a comparable value: arrays and maps (lists of pairs) sorted, structs as tuples."""
    if isinstance(value, (list, np.ndarray)):
        return tuple(sorted((_plain(v) for v in value), key=repr))
    if isinstance(value, (tuple, dict)):
        return tuple(_plain(v) for v in (value.values() if isinstance(value, dict) else value))
    return value


def _table(path: str, order: list[str], drop: tuple[str, ...] = ()) -> pd.DataFrame:
    df = DeltaTable(path).to_pandas()
    df = df.drop(columns=[c for c in df.columns if c in drop or c.endswith(("__hll", "__kll"))])
    for col in df.columns:
        if df[col].dtype == object:
            df[col] = df[col].map(_plain)
    return df.sort_values(order).reset_index(drop=True)


def _stream_tables(spec: PipelineSpec) -> dict[str, pd.DataFrame]:
    t, keys = PipelineTables(spec.lake, spec.name), list(spec.key_columns)
    return {"aggregates": _table(t.aggregates, keys, ("updated_at", "run_id")),
            "changelog": _table(t.changelog, ["batch_id", "seq"], ("run_id",)),
            "partials": _table(t.partials, ["batch", "event_date", *keys], ("run_id", "created_at")),
            "state": _table(t.stream_state, ["event_date", *keys])}


def test_batches_expected_to_fit_the_driver_come_to_it_in_the_pass_and_a_denser_one_merges_in_spark(spark, tmp_path):
    """Past the files' row counts, the groups per row of the batches before say whether a batch fits the driver
    engine; the pass itself then brings it to the driver (no count job first). A batch denser than expected
    merges in Spark all the same, and the tables equal the oracle."""
    landing = tmp_path / "landing"
    spec = with_stream(make_spec(tmp_path, window={"size": "1 hour"}), max_files_per_batch=1, watermark="1 day")
    day = day_events("2024-03-01", 300, pages=("/a", "/b")).sort_by("event_time")
    for offset, n in ((0, 140), (140, 80), (220, 80)):  # over 8 hours and 2 pages: at most 16 groups each
        land(landing, "2024-03-01", day.slice(offset, n))
    land(landing, "2024-03-02", day_events("2024-03-02", 100, pages=tuple(f"/p{i}" for i in range(100))))
    batches = stream.run(spark, spec, available_now=True, driver_max_keys=60).batches
    counted_first = ["collect" in b.phases.seconds for b in batches]  # counted in Spark, then collected
    assert counted_first == [True, False, False, False]  # the first sets the groups per row: 2 x 16/140 x 100 < 60
    assert [b.on_driver for b in batches] == [True, True, True, False]  # the last holds about 90 groups
    assert_matches(actual(PipelineTables(spec.lake, spec.name).aggregates, spec), expected(read_landing(landing), spec),
                   spec)
    # before any batch, one whose bound is within twice the limit is tried in the pass (140 rows <= 2 x 70)
    again = stream.run(spark, spec.with_paths(lake=str(tmp_path / "lake-again")), available_now=True,
                       driver_max_keys=70).batches
    assert ["collect" in b.phases.seconds for b in again] == [False] * 4


def test_the_spark_merge_merges_on_from_the_tables_the_driver_merge_wrote(spark, tmp_path):
    """Small batches merge on the driver with the Python algebra; a large one after them merges in Spark from the
    state and sketches the driver wrote, into the tables the driver alone would have written (the two engines
    over the same batches, for every window kind: test_stream_engines.py)."""
    landing = tmp_path / "landing"
    spec = with_stream(make_spec(tmp_path, window={"size": "1 hour"}), max_files_per_batch=2, watermark="2 hours")
    rows = day_events("2024-03-01", 600, pages=("/a", "/b", "/c", "/d")).sort_by("event_time")
    files = [rows.slice(i * 75, 75) for i in range(8)]
    for table in files[:6]:
        land(landing, "2024-03-01", table)
    later = files[6:]
    by_driver, then_spark = (spec.with_paths(lake=str(tmp_path / f"lake-{name}")) for name in ("driver", "spark"))
    for run_spec in (by_driver, then_spark):
        assert all(b.on_driver for b in stream.run(spark, run_spec, available_now=True).batches)
    for table in later:
        land(landing, "2024-03-01", table)
    assert [b.on_driver for b in stream.run(spark, by_driver, available_now=True).batches] == [True]
    assert [b.on_driver for b in stream.run(spark, then_spark, available_now=True, driver_max_keys=0).batches] == [
        False]
    want, got = _stream_tables(by_driver), _stream_tables(then_spark)
    for name in ("aggregates", "changelog", "partials", "state"):
        # KLL compaction is randomised in both engines: its quantiles agree within the rank error only
        pd.testing.assert_frame_equal(got[name].drop(columns="p90_ms", errors="ignore"),
                                      want[name].drop(columns="p90_ms", errors="ignore"),
                                      check_exact=False, rtol=1e-12, check_dtype=False, obj=name)
    assert_matches(actual(PipelineTables(then_spark.lake, spec.name).aggregates, spec),
                   expected(read_landing(landing), spec), spec)
