"""Reruns, backfills and mixed batch/stream partials never count a row twice or lose one."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import datasketches as ds
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark_jobs.jobs import combine, landing, reduce
from spark_jobs.lake import PipelineTables, open_lake
from spark_jobs.lake.table_rules import PARTIALS_PARTITIONS, reduce_app_id
from spark_jobs.phases.compiled import CompiledAggregates
from spark_jobs.spec import PipelineSpec
from tests.builders import FAST_AGGREGATES, day_events, make_spec, write_day
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

D1, D2, D3 = "2024-03-01", "2024-03-02", "2024-03-03"
VOLATILE = ("run_id", "created_at", "updated_at")


def _canon(name: str, value: Any) -> Any:
    """A value comparable across runs: sets sorted, sketches decoded to what they hold."""
    if not isinstance(value, (bytes, bytearray, dict, list, tuple, np.ndarray, str)) and pd.isna(value):
        return None
    if name.endswith("__hll"):
        return ("hll", round(ds.hll_sketch.deserialize(bytes(value)).get_estimate(), 6))
    if name.endswith("__kll"):
        return ("kll", tuple(sorted(ds.kll_doubles_sketch.deserialize(bytes(value)))))
    if name.endswith("__set"):
        return tuple(sorted(value))
    if isinstance(value, dict):
        return tuple(sorted((k, _canon(k, v)) for k, v in value.items()))
    return value


def canonical(df: pd.DataFrame, keys: list[str]) -> list[dict[str, Any]]:
    """Rows without run ids and timestamps of writing, sorted by ``keys``."""
    df = df.drop(columns=[c for c in VOLATILE if c in df.columns])
    rows = [{k: _canon(k, v) for k, v in rec.items()} for rec in df.to_dict("records")]
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in keys))


def day_files(path: str, date: str, source: str = "batch") -> set[str]:
    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    return {a["path"] for a in actions
            if str(a["partition.event_date"]) == date and a["partition.source"] == source}


def stream_partials(spark, spec: PipelineSpec, date: str):
    """What a streaming job would have written for ``date``: the pure combine transform, source=stream."""
    from pyspark.sql import functions as F

    rows = landing.classify(landing.read_landing(spark, spec, landing.screen_partition(spec, date)), spec, date)
    valid = rows.where(F.col("_reason").isNull()).drop("_raw", "_reason", "_file")
    out = combine.combine(valid, spec, CompiledAggregates(spec), date=date, run_id="stream-run-1")
    return out.withColumn("source", F.lit("stream")).withColumn("batch", F.lit("stream-1"))


def oracle_check(root: Path, spec: PipelineSpec) -> None:
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(root / "landing"), spec), spec)


def test_rerunning_combine_replaces_the_day_with_identical_partials(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES, window={"size": "1 hour"})
    tables = PipelineTables(spec.lake, spec.name)
    write_day(tmp_path / "landing", D1, day_events(D1, 120, rejected=3))
    keys = ["event_date", "source", *spec.key_columns]

    first = combine.run(spark, spec, D1)
    v1, rows1 = DeltaTable(tables.partials).version(), DeltaTable(tables.partials).to_pandas()
    dead1 = DeltaTable(tables.dead_letter).to_pandas()
    second = combine.run(spark, spec, D1)
    v2, rows2 = DeltaTable(tables.partials).version(), DeltaTable(tables.partials).to_pandas()

    assert first.status == second.status == "success"
    assert v2 == v1 + 1 and second.versions_written["partials"] == v2
    assert len(rows2) == len(rows1) > 0
    assert canonical(rows2, keys) == canonical(rows1, keys)
    assert set(rows2["run_id"]) == {second.run_id}

    dead2 = DeltaTable(tables.dead_letter).to_pandas()
    assert len(dead1) == len(dead2) == 3, "the day's rejects are replaced, not appended"
    assert set(dead2["run_id"]) == {second.run_id} and set(dead2["batch"]) == {D1}
    assert sorted(dead2["raw"]) == sorted(dead1["raw"])
    assert (second.rows_in, second.rows_rejected) == (123, 3) and second.rows_aggregated == 120


def test_a_backfilled_day_re_merges_only_its_own_keys(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES, window={"size": "1 hour"})
    tables = PipelineTables(spec.lake, spec.name)
    landing = tmp_path / "landing"
    for i, day in enumerate((D1, D2, D3)):
        write_day(landing, day, day_events(day, 80, seed=i))
        combine.run(spark, spec, day)
    first = reduce.run(spark, spec)
    assert first.message == "full merge"
    oracle_check(tmp_path, spec)
    all_before = {f.path for f in open_lake(spark, "embedded").files(tables.partials)}
    d1_before = day_files(tables.partials, D1)

    # day 1 lands again with other rows: page /c disappears, /d appears
    write_day(landing, D1, day_events(D1, 70, seed=99, pages=("/a", "/b", "/d")))
    combine.run(spark, spec, D1)
    d1_after = day_files(tables.partials, D1)
    second = reduce.run(spark, spec)

    assert second.status == "success"
    oracle_check(tmp_path, spec)
    match = re.fullmatch(r"(\d+) partial files changed", second.message)
    assert match, second.message
    changed = int(match.group(1))
    assert changed == len(d1_before) + len(d1_after)
    assert changed < len(all_before | d1_after), "a backfill of one day must not re-merge every file"

    got = actual(tables.aggregates, spec)
    day = got["window_start"].dt.date.astype(str)
    assert set(got.loc[day == D1, "run_id"]) == {second.run_id}
    assert set(got.loc[day.isin([D2, D3]), "run_id"]) == {first.run_id}, "days 2-3 were rewritten"
    assert not got.loc[day == D1, "page"].isin(["/c"]).any() and got.loc[day == D1, "page"].isin(["/d"]).any()


def test_incremental_reduces_equal_one_reduce_a_noop_rerun_and_a_full_reduce(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)  # keys (page) span days: re-merged each time
    tables = PipelineTables(spec.lake, spec.name)
    for i, day in enumerate((D1, D2, D3)):
        write_day(tmp_path / "landing", day, day_events(day, 50, seed=i))
        combine.run(spark, spec, day)
        step = reduce.run(spark, spec)
        assert step.status == "success"
        assert step.message == ("full merge" if i == 0 else f"{len(day_files(tables.partials, day))} partial files changed")
    incremental = DeltaTable(tables.aggregates).to_pandas()
    oracle_check(tmp_path, spec)

    # nothing new in partials: a second reduce is a no-op and adds no version
    version = DeltaTable(tables.aggregates).version()
    again = reduce.run(spark, spec)
    assert again.status == "noop" and "already merged" in again.message and again.versions_written == {}
    assert DeltaTable(tables.aggregates).version() == version
    assert DeltaTable(tables.aggregates).transaction_version(reduce_app_id(spec)) == DeltaTable(tables.partials).version()
    pd.testing.assert_frame_equal(DeltaTable(tables.aggregates).to_pandas(), incremental)

    # the same partials, reduced once
    once_spec = spec.with_paths(lake=str(tmp_path / "lake_once"))
    once_tables = PipelineTables(once_spec.lake, once_spec.name)
    shutil.copytree(tables.partials, once_tables.partials)
    shutil.copytree(tables.specs, once_tables.specs)
    reduce.run(spark, once_spec)
    once = DeltaTable(once_tables.aggregates).to_pandas()
    keys = list(spec.key_columns)
    assert canonical(incremental, keys) == canonical(once, keys)

    full = reduce.run(spark, spec, full=True)
    assert full.status == "success" and full.message == "full merge"
    assert DeltaTable(tables.aggregates).version() == version + 1
    assert canonical(DeltaTable(tables.aggregates).to_pandas(), keys) == canonical(incremental, keys)
    assert set(DeltaTable(tables.aggregates).to_pandas()["run_id"]) == {full.run_id}


def test_batch_partials_supersede_stream_partials_of_their_day(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    tables = PipelineTables(spec.lake, spec.name)
    lake = open_lake(spark, "embedded")
    write_day(tmp_path / "landing", D1, day_events(D1, 60, seed=1))
    write_day(tmp_path / "landing", D2, day_events(D2, 60, seed=2))

    # d2 has only stream partials: they count
    combine.run(spark, spec, D1)
    lake.append(stream_partials(spark, spec, D2), tables.partials, partition_by=PARTIALS_PARTITIONS)
    assert day_files(tables.partials, D2, "stream") and not day_files(tables.partials, D2, "batch")
    reduce.run(spark, spec)
    oracle_check(tmp_path, spec)
    assert actual(tables.aggregates, spec)["n_rows"].sum() == 120

    # d2's batch partials arrive: the stream ones stop counting
    combine.run(spark, spec, D2)
    record = reduce.run(spark, spec)
    changed = len(day_files(tables.partials, D2, "stream")) + len(day_files(tables.partials, D2, "batch"))
    assert record.message == f"{changed} partial files changed"
    oracle_check(tmp_path, spec)
    assert actual(tables.aggregates, spec)["n_rows"].sum() == 120


def _batch_then_stream(spark, tmp_path, make_stream, days=(D1, D2)):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    tables = PipelineTables(spec.lake, spec.name)
    lake = open_lake(spark, "embedded")
    for i, day in enumerate(days):
        write_day(tmp_path / "landing", day, day_events(day, 60, seed=i))
        combine.run(spark, spec, day)
    reduce.run(spark, spec)
    before = DeltaTable(tables.aggregates).to_pandas()

    lake.append(make_stream(spec, lake, tables), tables.partials, partition_by=PARTIALS_PARTITIONS)
    assert day_files(tables.partials, D2, "stream") and day_files(tables.partials, D2, "batch")
    record = reduce.run(spark, spec)

    assert record.status == "success" and record.message == "0 partial files changed"
    oracle_check(tmp_path, spec)
    keys = list(spec.key_columns)
    assert canonical(DeltaTable(tables.aggregates).to_pandas(), keys) == canonical(before, keys)


def test_stream_partials_of_a_day_with_batch_partials_do_not_count(spark, tmp_path):
    _batch_then_stream(spark, tmp_path, lambda spec, lake, tables: stream_partials(spark, spec, D2))


def test_partials_read_from_the_lake_can_be_appended_back_as_stream_partials(spark, tmp_path):
    from pyspark.sql import functions as F

    def from_batch(spec, lake, tables):
        batch_d2 = lake.read(tables.partials, partitions=[("event_date", "=", D2), ("source", "=", "batch")])
        return batch_d2.withColumn("source", F.lit("stream")).withColumn("batch", F.lit("stream-1"))

    _batch_then_stream(spark, tmp_path, from_batch, days=(D2,))


def test_a_reduce_after_vacuum_of_replaced_partials_merges_everything(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES, window={"size": "1 hour"})
    tables = PipelineTables(spec.lake, spec.name)
    for date in (D1, D2):
        write_day(tmp_path / "landing", date, day_events(date, 60))
        combine.run(spark, spec, date)
    reduce.run(spark, spec)
    write_day(tmp_path / "landing", D1, day_events(D1, 45, seed=99))
    combine.run(spark, spec, D1)
    DeltaTable(tables.partials).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    record = reduce.run(spark, spec)
    assert record.message == "full merge"
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(tmp_path / "landing"), spec), spec)


def test_a_new_day_outside_every_existing_file_s_window_range_is_appended(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES, window={"size": "1 hour"})
    tables = PipelineTables(spec.lake, spec.name)
    files = []
    for date in (D1, D3):  # D3's windows lie outside every aggregates file of D1: no file is rewritten
        write_day(tmp_path / "landing", date, day_events(date, 30))
        combine.run(spark, spec, date)
        reduce.run(spark, spec)
        files.append(set(pa.table(DeltaTable(tables.aggregates).get_add_actions(flatten=True))["path"].to_pylist()))
    assert files[0] < files[1]
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(tmp_path / "landing"), spec), spec)


def test_combines_of_two_days_creating_partials_at_once_both_land(spark, tmp_path, monkeypatch):
    """A parallel combine of another day may create ``partials`` between our check and our commit."""
    from spark_jobs.lake._embedded import EmbeddedLake

    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    for date in ("2024-03-01", "2024-03-02"):
        write_day(tmp_path / "landing", date, day_events(date, 50, seed=2))
    stage = EmbeddedLake._stage
    raced: list[str] = []

    def stage_then_race(self, df, path, partition_by):  # the other day's combine commits while we stage
        adds = stage(self, df, path, partition_by)
        if path.endswith("/partials") and not raced:
            raced.append(path)
            combine.run(spark, spec, "2024-03-02")
        return adds

    monkeypatch.setattr(EmbeddedLake, "_stage", stage_then_race)
    combine.run(spark, spec, "2024-03-01")
    assert raced
    days = DeltaTable(PipelineTables(spec.lake, spec.name).partials).to_pandas()["event_date"].astype(str)
    assert set(days) == {"2024-03-01", "2024-03-02"}
    reduce.run(spark, spec)
    assert_matches(actual(PipelineTables(spec.lake, spec.name).aggregates, spec),
                   expected(read_landing(tmp_path / "landing"), spec), spec)
