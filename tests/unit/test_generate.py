"""The sample-data generator: layout, determinism, skew and the bad records it plants."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from spark_jobs.jobs.generate import GenerateConfig, GenerateResult, generate

DAYS, ROWS, FILES = 3, 2000, 2
DATES = ["2024-03-01", "2024-03-02", "2024-03-03"]
COLUMNS = ["event_time", "user_id", "page", "duration_ms", "weight", "country"]


def config(out: Path, **overrides: object) -> GenerateConfig:
    kwargs: dict[str, object] = {"out": str(out), "days": DAYS, "rows_per_day": ROWS, "files_per_day": FILES}
    kwargs.update(overrides)
    return GenerateConfig(**kwargs)  # type: ignore[arg-type]


def partition_files(out: Path, date: str) -> list[Path]:
    return sorted((out / f"event_date={date}").iterdir())


def read_parquet(out: Path) -> dict[str, pa.Table]:
    return {date: pa.concat_tables(pq.read_table(f) for f in partition_files(out, date)) for date in DATES}


@pytest.fixture(scope="module")
def parquet_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GenerateResult]:
    out = tmp_path_factory.mktemp("parquet")
    return out, generate(config(out), progress=False)


@pytest.fixture(scope="module")
def json_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GenerateResult]:
    out = tmp_path_factory.mktemp("json")
    # enough planted bad records per file to get both kinds (truncated line, wrong type)
    return out, generate(config(out, format="json", bad_fraction=0.01), progress=False)


# --- parquet -----------------------------------------------------------------------------------


def test_partitions_and_files(parquet_out: tuple[Path, GenerateResult]) -> None:
    out, result = parquet_out
    assert sorted(p.name for p in out.iterdir()) == [f"event_date={d}" for d in DATES]
    for date in DATES:
        assert [f.name for f in partition_files(out, date)] == ["part-00000.parquet", "part-00001.parquet"]
    assert result.dates == DATES
    assert result.files == DAYS * FILES
    assert result.rows == DAYS * ROWS


def test_total_rows_and_schema(parquet_out: tuple[Path, GenerateResult]) -> None:
    out, _ = parquet_out
    tables = read_parquet(out)
    assert sum(t.num_rows for t in tables.values()) == DAYS * ROWS
    for t in tables.values():
        assert t.num_rows == ROWS
        assert t.column_names == COLUMNS
        assert t.schema.field("event_time").type == pa.timestamp("us", tz="UTC")
        assert t.schema.field("duration_ms").type == pa.int64()


def test_event_times_fall_within_their_partition_date(parquet_out: tuple[Path, GenerateResult]) -> None:
    out, _ = parquet_out
    for date, table in read_parquet(out).items():
        times = table.column("event_time").drop_null().to_pylist()
        assert times
        assert {t.astimezone(dt.UTC).date().isoformat() for t in times} == {date}


def test_bad_rows_lack_an_event_time_or_a_page(parquet_out: tuple[Path, GenerateResult]) -> None:
    out, result = parquet_out
    tables = read_parquet(out)
    missing = sum(t.column("event_time").null_count + t.column("page").null_count for t in tables.values())
    assert missing == result.bad_rows


def test_page_distribution_is_skewed(parquet_out: tuple[Path, GenerateResult]) -> None:
    out, _ = parquet_out
    pages = pa.concat_tables(read_parquet(out).values()).column("page").drop_null()
    counts = np.array(pc.value_counts(pages).field("counts").to_pylist(), dtype=float)
    shares = counts / counts.sum()
    assert shares.max() > 5 * np.median(shares)


def test_same_seed_gives_identical_data(parquet_out: tuple[Path, GenerateResult], tmp_path: Path) -> None:
    out, first = parquet_out
    second = generate(config(tmp_path), progress=False)
    assert second == first
    again, before = read_parquet(tmp_path), read_parquet(out)
    for date in DATES:
        assert again[date].equals(before[date])
        for a, b in zip(partition_files(tmp_path, date), partition_files(out, date), strict=True):
            assert a.read_bytes() == b.read_bytes()


def test_different_seed_gives_different_data(parquet_out: tuple[Path, GenerateResult], tmp_path: Path) -> None:
    out, _ = parquet_out
    generate(config(tmp_path, seed=8), progress=False)
    other, base = read_parquet(tmp_path), read_parquet(out)
    assert all(not other[d].equals(base[d]) for d in DATES)


def test_generate_replaces_existing_partitions(tmp_path: Path) -> None:
    stale = tmp_path / "event_date=2024-03-01" / "part-00009.parquet"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale")
    generate(config(tmp_path, days=1, files_per_day=1), progress=False)
    assert [f.name for f in partition_files(tmp_path, "2024-03-01")] == ["part-00000.parquet"]


# --- json ----------------------------------------------------------------------------------------


def json_lines(out: Path) -> list[str]:
    return [line for d in DATES for f in partition_files(out, d) for line in f.read_text().splitlines()]


def test_json_layout_and_row_count(json_out: tuple[Path, GenerateResult]) -> None:
    out, result = json_out
    for date in DATES:
        assert [f.name for f in partition_files(out, date)] == ["part-00000.json", "part-00001.json"]
    assert len(json_lines(out)) == DAYS * ROWS
    assert result.rows == DAYS * ROWS
    assert result.files == DAYS * FILES


def test_json_has_truncated_lines_and_wrong_types(json_out: tuple[Path, GenerateResult]) -> None:
    out, _ = json_out
    invalid, wrong_type, records = 0, 0, []
    for line in json_lines(out):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            invalid += 1
            continue
        records.append(record)
        if record["duration_ms"] == "n/a":
            wrong_type += 1
    assert invalid > 0
    assert wrong_type > 0
    assert set(records[0]) == set(COLUMNS)


def test_json_bad_rows_are_counted(json_out: tuple[Path, GenerateResult]) -> None:
    out, result = json_out
    invalid = wrong_type = missing = 0
    for line in json_lines(out):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            invalid += 1
            continue
        wrong_type += record["duration_ms"] == "n/a"
        missing += record["event_time"] is None or record["page"] is None
    # bad_rows = broken lines (truncated or wrong type) + rows planted with a NULL event_time or page;
    # a truncated line may hide a planted NULL row
    planted = result.bad_rows - invalid - wrong_type
    assert missing <= planted <= missing + invalid
    assert planted > 0


def test_json_with_default_bad_fraction_has_a_broken_line_per_file(tmp_path: Path) -> None:
    generate(config(tmp_path, format="json", days=1), progress=False)
    for f in partition_files(tmp_path, DATES[0]):
        bad = 0
        for line in f.read_text().splitlines():
            try:
                json.loads(line)
            except json.JSONDecodeError:
                bad += 1
        assert bad >= 1, f


# --- csv -----------------------------------------------------------------------------------------


def test_csv(tmp_path: Path) -> None:
    result = generate(config(tmp_path, format="csv"), progress=False)
    total = 0
    for date in DATES:
        files = partition_files(tmp_path, date)
        assert [f.name for f in files] == ["part-00000.csv", "part-00001.csv"]
        for f in files:
            table = pacsv.read_csv(f)
            assert table.column_names == COLUMNS
            total += table.num_rows
            times = [t for t in table.column("event_time").to_pylist() if t is not None]
            assert {t.date().isoformat() for t in times} == {date}
    assert total == DAYS * ROWS == result.rows
    assert result.files == DAYS * FILES


# --- config validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"days": 0}, "--days must be >= 1, got 0"),
        ({"format": "xml"}, "--format must be parquet, json or csv, got 'xml'"),
        ({"start": "2024-13-01"}, "--start must be YYYY-MM-DD, got '2024-13-01'"),
        ({"rows_per_day": 0}, "--rows-per-day must be >= 1, got 0"),
        ({"files_per_day": 0}, "--files-per-day must be 1..1000, got 0"),
        ({"bad_fraction": 1.0}, "--bad-fraction must be in [0, 1), got 1.0"),
    ],
)
def test_config_rejects_bad_values(overrides: dict[str, object], message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        config(tmp_path, **overrides)


def test_config_reports_all_bad_values_at_once(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"--days must be >= 1.*; --format must be .*; --start must be"):
        config(tmp_path, days=0, format="xml", start="2024-13-01")


def test_config_dates(tmp_path: Path) -> None:
    assert config(tmp_path, start="2024-02-28", days=3).dates == ["2024-02-28", "2024-02-29", "2024-03-01"]
