"""Landing files that cannot be read, next to good ones, in combine and in the stream.

Each kind an operator meets: an interrupted upload (a truncated Parquet file), a text file named
``.parquet``, a Parquet file whose number column holds strings, one whose footer is whole but a data page
is not (only Spark's read finds it), and a zero-byte file. A file counts
all or nothing; ``source.on_bad_file`` quarantines it (dead_letter, runs) or stops the job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import DeltaTable

from spark_jobs.errors import InputError
from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables
from spark_jobs.spec import PipelineSpec, load_spec
from spark_jobs.stream import query as stream
from tests.builders import FAST_AGGREGATES, day_events, make_spec, write_day
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

DAY = "2024-03-01"
_mtime = [1_700_000_000]


def _touch(path: Path) -> Path:
    """Newer than every file before it: the stream's file source hands files out in that order."""
    _mtime[0] += 10
    os.utime(path, (_mtime[0], _mtime[0]))
    return path


def land_bad_files(part: Path, good: pa.Table) -> dict[str, Path]:
    """The three unreadable kinds and an empty file, in the landing day ``part``."""
    truncated = part / "upload-interrupted.parquet"
    pq.write_table(good.slice(0, 50), truncated)
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    text = part / "notes.parquet"
    text.write_text("event_time,page\n2024-03-01 10:00:00,/a\n")
    strings = part / "strings.parquet"
    pq.write_table(good.slice(0, 20).set_column(good.schema.get_field_index("duration_ms"), "duration_ms",
                                                pa.array([str(i) for i in range(20)])), strings)
    page = part / "corrupt-page.parquet"
    pq.write_table(good, page)
    data = bytearray(page.read_bytes())
    column = pq.read_metadata(page).row_group(0).column(good.schema.get_field_index("duration_ms"))
    data[column.data_page_offset + 40: column.data_page_offset + 640] = b"\xab" * 600
    page.write_bytes(bytes(data))
    empty = part / "empty.parquet"
    empty.write_bytes(b"")
    return {"truncated": _touch(truncated), "text": _touch(text), "strings": _touch(strings), "page": _touch(page),
            "empty": _touch(empty)}


def with_policy(spec: PipelineSpec, policy: str) -> PipelineSpec:
    raw = yaml.safe_load(Path(spec.origin).read_text())
    raw["source"]["on_bad_file"] = policy
    Path(spec.origin).write_text(yaml.safe_dump(raw))
    return load_spec(spec.origin)


@pytest.fixture
def landed(tmp_path: Path) -> tuple[PipelineSpec, pa.Table, dict[str, Path]]:
    """A day of good files (the oracle's rows) with the bad ones beside them."""
    spec = make_spec(tmp_path, window={"size": "1 hour"}, aggregates=FAST_AGGREGATES)
    good = day_events(DAY, 400, seed=3)
    write_day(tmp_path / "landing", DAY, good, files=2)
    for f in (tmp_path / "landing" / f"event_date={DAY}").iterdir():
        _touch(f)
    rows = read_landing(tmp_path / "landing")  # the good files' rows: what every job must count
    bad = land_bad_files(tmp_path / "landing" / f"event_date={DAY}", good)
    return spec, rows, bad


def file_records(spec: PipelineSpec) -> list[dict]:
    rows = DeltaTable(PipelineTables(spec.lake, spec.name).dead_letter).to_pyarrow_table().to_pylist()
    return sorted((r for r in rows if r["reason"].startswith("file quarantined")), key=lambda r: r["source_file"])


def assert_quarantined(spec: PipelineSpec, bad: dict[str, Path], job: str) -> None:
    records = file_records(spec)
    assert [Path(r["source_file"]).name for r in records] == \
        ["corrupt-page.parquet", "notes.parquet", "strings.parquet", "upload-interrupted.parquet"]
    assert {r["job"] for r in records} == {job}
    for r in records:
        raw = json.loads(r["raw"])
        assert raw["path"] == r["source_file"] and raw["size"] == os.path.getsize(bad[{
            "notes.parquet": "text", "strings.parquet": "strings", "upload-interrupted.parquet": "truncated",
            "corrupt-page.parquet": "page"}[Path(raw["path"]).name]])
        assert r["run_id"]
    reasons = {Path(r["source_file"]).name: r["reason"] for r in records}
    assert "not a readable Parquet file" in reasons["upload-interrupted.parquet"]
    assert "not a readable Parquet file" in reasons["notes.parquet"]
    assert "column duration_ms holds string, the spec reads bigint" in reasons["strings.parquet"]
    assert reasons["corrupt-page.parquet"].startswith("file quarantined: cannot be read: ")  # Spark's reason


def test_combine_quarantines_each_bad_file_and_counts_the_rest_once(spark, landed):
    spec, rows, bad = landed
    record = combine.run(spark, spec, DAY)
    reduce.run(spark, spec)
    assert (record.files_quarantined, record.files_skipped) == (4, 1)
    assert record.rows_in == 400 == record.rows_aggregated + record.rows_rejected
    assert_quarantined(spec, bad, "combine")
    assert_matches(actual(PipelineTables(spec.lake, spec.name).aggregates, spec), expected(rows, spec), spec)
    runs = DeltaTable(PipelineTables(spec.lake, spec.name).runs).to_pyarrow_table().to_pylist()
    assert [(r["files_quarantined"], r["files_skipped"]) for r in runs if r["job"] == "combine"] == [(4, 1)]
    combine.run(spark, spec, DAY)  # a rerun replaces the day's records: still one per file
    assert len(file_records(spec)) == 4


def test_combine_with_on_bad_file_fail_names_the_files_and_writes_nothing(spark, landed):
    spec, _, bad = landed
    spec = with_policy(spec, "fail")
    with pytest.raises(InputError) as info:
        combine.run(spark, spec, DAY)
    message = str(info.value)
    # the ones found before the day is read: the job stops before Spark reads a row
    assert "3 landing file(s) cannot be read (source.on_bad_file: fail)" in message
    for kind in ("truncated", "text", "strings"):
        assert str(bad[kind]) in message
    assert "set source.on_bad_file: quarantine" in message
    tables = PipelineTables(spec.lake, spec.name)
    assert not os.path.exists(tables.partials) and not os.path.exists(tables.dead_letter)


def test_the_stream_quarantines_bad_files_never_rereads_them_and_reads_a_fixed_one(spark, landed, tmp_path):
    spec, rows, bad = landed
    summary = stream.run(spark, spec, available_now=True)
    assert sum(b.files_quarantined for b in summary.batches) == 4
    # Spark's file source hands out no zero-byte file (nothing to split): it is neither read nor counted here
    assert sum(b.files_skipped for b in summary.batches) == 0
    assert "4 landing file(s) quarantined (see dead_letter)" in summary.summary()
    assert_quarantined(spec, bad, "stream")
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(rows, spec), spec)
    state_version = DeltaTable(tables.stream_state).version()
    dead_version = DeltaTable(tables.dead_letter).version()
    # a restart reads nothing again: the quarantined files were that batch's, and it committed
    again = stream.run(spark, spec, available_now=True)
    assert [b for b in again.batches if not b.replayed] == []
    assert DeltaTable(tables.dead_letter).version() == dead_version
    assert DeltaTable(tables.stream_state).version() == state_version
    # a mini-batch of only a broken file: recorded, nothing else changes
    part = tmp_path / "landing" / f"event_date={DAY}"
    (part / "another-interrupted.parquet").write_bytes(b"PAR1\x15\x00")
    _touch(part / "another-interrupted.parquet")
    lone = stream.run(spark, spec, available_now=True)
    assert [(b.files_quarantined, b.rows_in) for b in lone.batches if not b.replayed] == [(1, 0)]
    assert len(file_records(spec)) == 5 and DeltaTable(tables.stream_state).version() == state_version
    assert_matches(actual(tables.aggregates, spec), expected(rows, spec), spec)
    # the upload lands again, whole, under a new name (the next day's: the stream's watermark is past this one's)
    part = tmp_path / "landing" / "event_date=2024-03-02"
    part.mkdir()
    extra = day_events("2024-03-02", 60, seed=11)
    pq.write_table(extra, part / "upload-retried.parquet")
    _touch(part / "upload-retried.parquet")
    third = stream.run(spark, spec, available_now=True)
    assert sum(b.rows_in for b in third.batches) == 60 and sum(b.files_quarantined for b in third.batches) == 0
    everything = pa.concat_tables([rows, extra.append_column("event_date", pa.array(["2024-03-02"] * 60))])
    assert_matches(actual(tables.aggregates, spec), expected(everything, spec), spec)


def test_the_stream_with_on_bad_file_fail_stops_naming_the_file(spark, landed):
    spec, _, bad = landed
    spec = with_policy(spec, "fail")
    with pytest.raises(InputError, match=r"cannot be read \(source.on_bad_file: fail\)") as info:
        stream.run(spark, spec, available_now=True)
    assert str(bad["strings"]) in str(info.value)
    assert not os.path.exists(PipelineTables(spec.lake, spec.name).aggregates)


def test_the_cli_says_what_it_quarantined_and_exits_zero(landed, spark_server):
    spec, _, _ = landed
    proc = subprocess.run([sys.executable, "-m", "spark_jobs", "combine", "--pipeline", spec.origin, "--date", DAY,
                           "--remote", spark_server.remote], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 file(s) quarantined, 1 empty file(s) skipped" in proc.stdout + proc.stderr
