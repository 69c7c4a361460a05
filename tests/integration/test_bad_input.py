"""Bad input fails loudly with a useful message, or lands in dead_letter; the lake is never half-written."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark_jobs.errors import InputError, LakeError, SchemaMismatchError, SpecChangedError
from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables
from tests.builders import FAST_AGGREGATES, day_events, events, make_spec, write_day, write_text
from tests.integration.test_bad_files import with_policy
from tests.oracle import actual, assert_matches, expected

pytestmark = pytest.mark.spark

D1, D2 = "2024-03-01", "2024-03-02"
DAY1 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
COLUMNS = ("event_time", "user_id", "page", "duration_ms", "weight", "country")
REPO = Path(__file__).resolve().parents[2]


def good_rows(n: int) -> list[tuple[Any, ...]]:
    return [(DAY1 + dt.timedelta(minutes=37 * i), f"u{i % 4}", ("/a", "/b")[i % 2], None if i % 5 == 0 else 100 * i,
             (0.5, 1.0)[i % 2], ("DE", "US", None)[i % 3]) for i in range(n)]


def as_record(row: tuple[Any, ...]) -> dict[str, Any]:
    rec = dict(zip(COLUMNS, row, strict=True))
    if isinstance(rec["event_time"], dt.datetime):
        rec["event_time"] = rec["event_time"].strftime("%Y-%m-%dT%H:%M:%SZ")
    return rec


def as_strings(rec: dict[str, Any]) -> dict[str, str]:
    """A record as the text reader sees it: every present value as its text."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in rec.items() if v is not None}


def oracle_of(rows: list[tuple[Any, ...]], date: str) -> pa.Table:
    table = events(rows)
    return table.append_column("event_date", pa.array([date] * table.num_rows))


def dead_letters(tables: PipelineTables) -> list[dict[str, Any]]:
    return DeltaTable(tables.dead_letter).to_pyarrow_table().to_pylist()


def runs(tables: PipelineTables) -> list[dict[str, Any]]:
    return sorted(DeltaTable(tables.runs).to_pyarrow_table().to_pylist(), key=lambda r: r["started_at"])


# ------------------------------------------------------------------------------------- missing / corrupt
def test_a_missing_landing_partition_is_an_input_error_and_creates_no_table(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    tables = PipelineTables(spec.lake, spec.name)
    (tmp_path / "landing").mkdir()
    partition = spec.source.partition_path("2024-03-09")
    with pytest.raises(InputError, match=rf"no landing partition {partition}; check --date"):
        combine.run(spark, spec, "2024-03-09")
    assert not DeltaTable.is_deltatable(tables.partials)
    assert not os.path.exists(tables.partials)
    failed = runs(tables)[-1]
    assert failed["status"] == "failed" and failed["message"].startswith("InputError: no landing partition")


def test_a_corrupt_parquet_file_fails_the_day_and_leaves_partials_untouched(spark, tmp_path):
    """With ``source.on_bad_file: fail``; the default quarantines it (tests/integration/test_bad_files.py)."""
    spec = with_policy(make_spec(tmp_path, aggregates=FAST_AGGREGATES), "fail")
    tables = PipelineTables(spec.lake, spec.name)
    write_day(tmp_path / "landing", D1, day_events(D1, 40))
    combine.run(spark, spec, D1)
    version, before = DeltaTable(tables.partials).version(), DeltaTable(tables.partials).to_pandas()

    write_day(tmp_path / "landing", D2, day_events(D2, 40))
    corrupt = tmp_path / "landing" / f"event_date={D2}" / "part-00001.parquet"
    corrupt.write_bytes(os.urandom(4096))
    with pytest.raises(InputError, match=rf"combine of {D2}: 1 landing file\(s\) cannot be read .*part-00001\.parquet") as err:
        combine.run(spark, spec, D2)
    assert not isinstance(err.value, SchemaMismatchError)

    assert DeltaTable(tables.partials).version() == version
    pd.testing.assert_frame_equal(DeltaTable(tables.partials).to_pandas(), before)
    assert runs(tables)[-1]["status"] == "failed" and runs(tables)[-1]["batch"] == D2


def test_parquet_without_a_spec_column_is_a_schema_mismatch(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    write_day(tmp_path / "landing", D1, day_events(D1, 10).drop_columns(["country"]))
    with pytest.raises(SchemaMismatchError, match=r"lacks columns \['country'\] that source.schema declares"):
        combine.run(spark, spec, D1)
    assert not DeltaTable.is_deltatable(PipelineTables(spec.lake, spec.name).partials)


@pytest.mark.parametrize(("values", "shown"), [
    (pa.array([[1, 2]] * 10, pa.list_(pa.int64())), "array<bigint>"),
    (pa.array([{"ms": 1}] * 10, pa.struct([("ms", pa.int64())])), "struct<ms:bigint>"),
])
def test_parquet_with_a_column_of_an_incompatible_type_is_a_schema_mismatch(spark, tmp_path, values, shown):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    table = day_events(D1, 10)
    table = table.set_column(table.schema.get_field_index("duration_ms"), "duration_ms", values)
    write_day(tmp_path / "landing", D1, table)
    with pytest.raises(SchemaMismatchError, match=rf"duration_ms is {shown}, spec says bigint"):
        combine.run(spark, spec, D1)


# ------------------------------------------------------------------------------------- rows to dead_letter
def test_bad_json_records_go_to_dead_letter_with_their_reason_and_text(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES, fmt="json", null_keys="reject")
    tables = PipelineTables(spec.lake, spec.name)
    good = good_rows(30)
    lines = [json.dumps(as_record(r)) for r in good]
    at = DAY1 + dt.timedelta(hours=5)
    truncated = json.dumps(as_record((at, "bad1", "/a", 5, 1.0, "DE")))[:40]
    bad = {  # user_id -> (record, reason)
        "bad2": ({**as_record((at, "bad2", "/a", 5, 1.0, "DE")), "duration_ms": "n/a"},
                 "duration_ms: cannot read n/a as bigint"),
        "bad3": ({k: v for k, v in as_record((at, "bad3", "/a", 5, 1.0, "DE")).items() if k != "event_time"},
                 "event_time is missing"),
        "bad4": (as_record((at, "bad4", None, 5, 1.0, "DE")), "group key page is missing"),
        "bad5": (as_record((at + dt.timedelta(days=1), "bad5", "/a", 5, 1.0, "DE")),
                 f"event_time 2024-03-02 05:00:00 is outside partition event_date={D1}"),
    }
    lines[3:3] = [truncated, *(json.dumps(rec) for rec, _ in bad.values())]
    write_text(tmp_path / "landing", D1, "part-00000.json", "\n".join(lines) + "\n")

    record = combine.run(spark, spec, D1)
    assert (record.rows_in, record.rows_aggregated, record.rows_rejected) == (35, 30, 5)

    dead = dead_letters(tables)
    assert len(dead) == 5 and {d["run_id"] for d in dead} == {record.run_id}
    assert all(d["source_file"].endswith("part-00000.json") for d in dead)
    malformed = [d for d in dead if d["raw"] == truncated]
    assert len(malformed) == 1 and "malformed record" in malformed[0]["reason"]
    by_user = {json.loads(d["raw"]).get("user_id"): d for d in dead if d["raw"] != truncated}
    assert set(by_user) == set(bad)
    for user, (rec, reason) in bad.items():
        assert reason in by_user[user]["reason"], (user, by_user[user]["reason"])
        assert json.loads(by_user[user]["raw"]) == as_strings(rec)

    row = runs(tables)[-1]
    assert (row["status"], row["rows_in"], row["rows_aggregated"], row["rows_rejected"]) == ("success", 35, 30, 5)
    reduce.run(spark, spec)
    assert_matches(actual(tables.aggregates, spec), expected(oracle_of(good, D1), spec), spec)


def csv_text(columns: list[str], rows: list[dict[str, Any]]) -> str:
    lines = [",".join(columns), *(",".join("" if r.get(c) is None else str(r[c]) for c in columns) for r in rows)]
    return "\n".join(lines) + "\n"


def test_bad_csv_values_go_to_dead_letter(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES, fmt="csv")
    tables = PipelineTables(spec.lake, spec.name)
    header = [c for c, _ in spec.source.schema]  # CSV columns are positional: the spec's declared order
    good = good_rows(20)
    at = DAY1 + dt.timedelta(hours=7)
    bad = {
        "bad1": ({**as_record((at, "bad1", "/a", 5, 1.0, "DE")), "duration_ms": "abc"},
                 "duration_ms: cannot read abc as bigint"),
        "bad2": ({**as_record((at, "bad2", "/b", 5, 1.0, "DE")), "weight": "heavy"},
                 "weight: cannot read heavy as double"),
        "bad3": ({**as_record((at, "bad3", "/b", 5, 1.0, "DE")), "event_time": "yesterday"},
                 "event_time: cannot read yesterday as timestamp"),
    }
    records = [as_record(r) for r in good]
    records[5:5] = [rec for rec, _ in bad.values()]
    write_text(tmp_path / "landing", D1, "part-00000.csv", csv_text(header, records))

    record = combine.run(spark, spec, D1)
    assert (record.rows_in, record.rows_aggregated, record.rows_rejected) == (23, 20, 3)
    dead = {json.loads(d["raw"])["user_id"]: d for d in dead_letters(tables)}
    assert set(dead) == set(bad)
    for user, (rec, reason) in bad.items():
        assert reason in dead[user]["reason"], (user, dead[user]["reason"])
        assert json.loads(dead[user]["raw"]) == {k: str(v) for k, v in rec.items() if v is not None}
    assert "event_time is missing" in dead["bad3"]["reason"]

    reduce.run(spark, spec)
    assert_matches(actual(tables.aggregates, spec), expected(oracle_of(good, D1), spec), spec)


def test_csv_columns_are_read_by_header_name_in_any_order(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES, fmt="csv")
    header = [c for c, _ in spec.source.schema][::-1]  # same columns, not in the spec's order
    write_text(tmp_path / "landing", D1, "part-00000.csv", csv_text(header, [as_record(r) for r in good_rows(3)]))
    record = combine.run(spark, spec, D1)
    assert (record.rows_in, record.rows_rejected) == (3, 0)


def test_a_csv_day_with_headers_in_other_orders_serves_the_same_from_the_batch_and_the_stream(spark, tmp_path):
    """One landing reader: each CSV file is read by its own header's names, in the batch and in the stream alike."""
    from spark_jobs.stream import run as stream
    from tests.integration.test_stream import with_stream

    columns = [c for c, _ in make_spec(tmp_path, fmt="csv").source.schema]
    rows = good_rows(30)
    files = {"part-0.csv": (columns[::-1], rows[:15]), "part-1.csv": (columns[2:] + columns[:2], rows[15:])}
    specs = []
    for name in ("batch", "stream"):
        (tmp_path / name).mkdir()
        spec = make_spec(tmp_path / name, aggregates=FAST_AGGREGATES, fmt="csv", window={"size": "1 hour"})
        for file, (header, part) in files.items():
            write_text(tmp_path / name / "landing", D1, file, csv_text(header, [as_record(r) for r in part]))
        specs.append(with_stream(spec, max_files_per_batch=1, watermark="1 day") if name == "stream" else spec)
    combine.run(spark, specs[0], D1)
    reduce.run(spark, specs[0])
    summary = stream(spark, specs[1], available_now=True)
    assert sum(b.rows_rejected for b in summary.batches) == 0
    by_batch, by_stream = (actual(PipelineTables(s.lake, s.name).aggregates, s) for s in specs)
    values = [*specs[0].key_columns, *(a.name for a in specs[0].aggregates), "n_rows"]
    pd.testing.assert_frame_equal(by_batch[values], by_stream[values])
    assert_matches(by_batch, expected(oracle_of(rows, D1), specs[0]), specs[0])


def test_an_unreadable_file_is_named_with_its_reason_and_no_py4j_noise(spark, tmp_path):
    spec = with_policy(make_spec(tmp_path, aggregates=FAST_AGGREGATES), "fail")
    write_day(tmp_path / "landing", D1, day_events(D1, 20))
    (tmp_path / "landing" / f"event_date={D1}" / "part-00001.parquet").write_bytes(os.urandom(4096))
    with pytest.raises(InputError, match=rf"combine of {D1}: 1 landing file\(s\) cannot be read") as err:
        combine.run(spark, spec, D1)
    message = str(err.value)
    assert "An error occurred while calling" not in message
    assert "part-00001.parquet (4,096 bytes): not a readable Parquet file" in message, message


# ------------------------------------------------------------------------------------- lake state
def test_reduce_before_any_combine_says_to_run_combine(spark, tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    with pytest.raises(LakeError, match=r"no partials table at .*; run combine for at least one day first"):
        reduce.run(spark, spec)
    assert not DeltaTable.is_deltatable(PipelineTables(spec.lake, spec.name).aggregates)


def test_combining_with_a_changed_spec_into_the_same_lake_is_refused(spark, tmp_path):
    spec_a = make_spec(tmp_path, aggregates=[{"name": "views", "fn": "count"}])
    tables = PipelineTables(spec_a.lake, spec_a.name)
    write_day(tmp_path / "landing", D1, day_events(D1, 20))
    combine.run(spark, spec_a, D1)
    version = DeltaTable(tables.partials).version()

    spec_b = make_spec(tmp_path, aggregates=[{"name": "views", "fn": "count"},
                                             {"name": "total_ms", "fn": "sum", "column": "duration_ms"}])
    assert spec_b.lake == spec_a.lake and spec_b.name == spec_a.name
    with pytest.raises(SpecChangedError, match=r"differs from the spec the lake .* records.*plan --pipeline.*apply --pipeline"):
        combine.run(spark, spec_b, D1)
    assert DeltaTable(tables.partials).version() == version


# ------------------------------------------------------------------------------------- CLI exit codes
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARK_JOBS_DELTA_BACKEND": "embedded"}  # JAVA_HOME and PATH kept
    return subprocess.run([sys.executable, "-m", "spark_jobs", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_cli_bad_spec_exits_2_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: views\n"
        f"lake: {tmp_path / 'lake'}\n"
        f"source: {{path: {tmp_path / 'landing'}, event_time: event_time, schema: {{event_time: timestamp, page: string}}}}\n"
        "group_by: [nope]\n"
        "aggregates: [{name: views, fn: count}]\n"
    )
    proc = _cli("combine", "--pipeline", str(bad), "--date", D1)
    assert proc.returncode == 2, proc.stderr
    assert "invalid pipeline spec" in proc.stderr
    assert "group_by: column 'nope' is not in source.schema" in proc.stderr


BAD_OPTIONS = [
    (["--remote", "localhost:15002"], "bad Spark Connect address 'localhost:15002' (--remote or $SPARK_REMOTE); "
                                      "use sc://host:port"),
    (["--remote", "sc://localhost:port"], "bad Spark Connect address 'sc://localhost:port' (--remote or "
                                          "$SPARK_REMOTE): port 'port' is not a number"),
    (["--master", "bogus"], "bad Spark master 'bogus' (--master or $SPARK_MASTER); use local[*], local[N]"),
    (["--master", "localhost"], "bad Spark master 'localhost'"),
    (["--master", "local[two]"], "bad Spark master 'local[two]'"),
    (["--shuffle-partitions", "0"], "bad shuffle partitions 0 (--shuffle-partitions); use 1 or more"),
    (["--conf", "executor.memory=2g"], "bad --conf 'executor.memory=2g'; use --conf spark.some.key=value"),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS, ids=[" ".join(o) for o, _ in BAD_OPTIONS])
def test_cli_bad_spark_options_exit_2_before_spark_starts(tmp_path, options, message):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    proc = _cli("reduce", "--pipeline", spec.origin, *options)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: {message}" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "lake").exists()


def test_cli_bad_generate_arguments_exit_2(tmp_path):
    proc = _cli("generate", "--out", str(tmp_path / "landing"), "--days", "0", "--format", "xml")
    assert proc.returncode == 2, proc.stderr
    assert "error: --days must be >= 1, got 0; --format must be parquet, json or csv, got 'xml'" in proc.stderr
    assert not (tmp_path / "landing").exists()


@pytest.mark.slow
def test_cli_missing_partition_exits_3(tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    (tmp_path / "landing").mkdir()
    proc = _cli("combine", "--pipeline", spec.origin, "--date", "2024-03-09", "--master", "local[1]",
                "--shuffle-partitions", "1")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "error: no landing partition" in proc.stderr and "event_date=2024-03-09" in proc.stderr


@pytest.mark.parametrize("date", ["2024-02-30", "20240301", "2024-3-1", "2024-W09-5", "yesterday"])
def test_cli_bad_date_exits_2_before_the_lake_is_touched(tmp_path, date):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    proc = _cli("combine", "--pipeline", spec.origin, "--date", date)
    assert proc.returncode == 2, proc.stderr
    assert f"error: bad date '{date}'; use YYYY-MM-DD" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "lake").exists()
