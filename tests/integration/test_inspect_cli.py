"""``python -m spark_jobs inspect ...`` on real tables written by the jobs, read back through delta-rs.

Expected values come from reading the Delta tables directly (``DeltaTable`` + pandas), never
from the views under test. Every bad input must fail with a clear message and leave the lake
byte-for-byte unchanged.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark_jobs.__main__ import main
from tests.inspect_lake import D2, PIPELINE, shared_lake, snapshot

pytestmark = pytest.mark.spark

AGG = f"{PIPELINE}.aggregates"
PARTIALS = f"{PIPELINE}.partials"
KEYS = ["page", "window_start", "window_end"]


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    spec = shared_lake(spark, tmp_path_factory)
    return {"spec_file": spec.origin, "lake": spec.lake, "spec": spec}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def frame(path: str, version: int | None = None) -> pd.DataFrame:
    return DeltaTable(path, version=version).to_pyarrow_table().to_pandas()


# ----------------------------------------------------------------------------- views
def test_tables_lists_every_table_with_its_version_and_rows(lake, capsys):
    code, out, _ = run(capsys, "tables", "--pipeline", lake["spec_file"])
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:7] == ["table", "version", "rows", "files", "bytes", "last_commit", "operation"]
    assert [ln.split()[0] for ln in lines[2:]] == [PARTIALS, AGG, f"{PIPELINE}.changelog", f"{PIPELINE}.dead_letter",
                                                 f"{PIPELINE}.runs", f"{PIPELINE}.specs"]

    code, out, _ = run(capsys, "tables", "--lake", lake["lake"], "--json")
    rows = {r["table"]: r for r in json.loads(out)}
    agg_path = f"{lake['lake']}/{PIPELINE}/aggregates"
    assert rows[AGG]["version"] == DeltaTable(agg_path).version() == 1
    assert rows[AGG]["rows"] == len(frame(agg_path))
    assert rows[PARTIALS]["version"] == 2
    assert rows[f"{PIPELINE}.runs"]["rows"] == 5
    assert rows[AGG]["operation"] == "WRITE"


def test_tables_takes_the_lake_from_the_environment(lake, capsys, monkeypatch):
    monkeypatch.setenv("SPARK_JOBS_LAKE", lake["lake"])
    code, out, _ = run(capsys, "tables", "--json")
    assert code == 0 and len(json.loads(out)) == 6


def test_history_shows_runs_rows_and_what_each_commit_consumed(lake, capsys):
    code, out, _ = run(capsys, "history", AGG, "--pipeline", lake["spec_file"], "--json")
    assert code == 0
    hist = json.loads(out)
    assert [h["version"] for h in hist] == [1, 0]
    # the reduce records the partials version it merged as a Delta app transaction
    # ... and the spec version it ran with
    assert hist[0]["consumed"] == f"txn {PIPELINE}.reduce=2; txn {PIPELINE}.spec=1"
    assert hist[1]["consumed"] == f"txn {PIPELINE}.reduce=1; txn {PIPELINE}.spec=1"
    assert hist[1]["operation"] == "CREATE TABLE" and hist[1]["job"] == "reduce"
    assert hist[1]["rows_added"] == len(frame(f"{lake['lake']}/{PIPELINE}/aggregates", 0))
    runs = frame(f"{lake['lake']}/{PIPELINE}/runs")
    assert set(h["run_id"] for h in hist) <= set(runs["run_id"])

    code, out, _ = run(capsys, "history", PARTIALS, "--lake", lake["lake"], "--json")
    hist = {h["version"]: h for h in json.loads(out)}
    day2_rows_v1 = int((frame(f"{lake['lake']}/{PIPELINE}/partials", 1)["batch"] == D2).sum())
    assert hist[2]["batch"] == D2 and hist[2]["consumed"] == f"txn {PIPELINE}.spec=1; event_date={D2}"
    assert hist[2]["files_removed"] >= 1 and hist[2]["rows_removed"] == day2_rows_v1

    code, text, _ = run(capsys, "history", AGG, "--lake", lake["lake"])
    assert text.splitlines()[0].split()[:4] == ["version", "committed_at", "operation", "run_id"]


def test_show_time_travels_and_filters(lake, capsys):
    agg_path = f"{lake['lake']}/{PIPELINE}/aggregates"
    code, out, _ = run(capsys, "show", AGG, "--lake", lake["lake"], "--where", "page = '/d'", "--json", "--limit", "1000")
    assert code == 0
    latest = frame(agg_path)
    assert len(json.loads(out)) == int((latest["page"] == "/d").sum()) > 0

    code, out, _ = run(capsys, "show", AGG, "--lake", lake["lake"], "--version", "0", "--where", "page = '/d'")
    assert code == 0 and out.strip() == "(no rows)"

    where = f"page IN ('/a', '/b') AND window_start >= '{D2} 06:00' AND views > 0"
    code, out, _ = run(capsys, "show", AGG, "--lake", lake["lake"], "--version", "0", "--where", where,
                       "--columns", "page,window_start,views", "--order-by", "views:desc,page", "--limit", "1000",
                       "--json")
    got = pd.DataFrame(json.loads(out))
    old = frame(agg_path, 0)
    want = old[old["page"].isin(["/a", "/b"]) & (old["window_start"] >= pd.Timestamp(f"{D2} 06:00", tz="UTC"))
               & (old["views"] > 0)]
    assert len(got) == len(want) > 0
    assert list(got.columns) == ["page", "window_start", "views"]
    assert got["views"].tolist() == sorted(got["views"].tolist(), reverse=True)
    assert sorted(got["views"]) == sorted(want["views"])

    code, text, _ = run(capsys, "show", AGG, "--lake", lake["lake"], "--columns", "page,views", "--limit", "3")
    lines = text.splitlines()
    assert lines[0].split() == ["page", "views"] and len(lines) == 5


def test_show_as_of_a_time_reads_the_version_current_then(lake, capsys):
    agg_path = f"{lake['lake']}/{PIPELINE}/aggregates"
    v0_time = dt.datetime.fromtimestamp(DeltaTable(agg_path).history()[-1]["timestamp"] / 1000, dt.UTC)
    at = (v0_time + dt.timedelta(seconds=0.5)).strftime("%Y-%m-%d %H:%M:%S.%f")
    code, out, _ = run(capsys, "show", AGG, "--lake", lake["lake"], "--as-of", at, "--limit", "10000", "--json")
    assert code == 0
    assert len(json.loads(out)) == len(frame(agg_path, 0))

    code, _, err = run(capsys, "show", AGG, "--lake", lake["lake"], "--as-of", "2000-01-01")
    assert code == 2 and "has no version at or before 2000-01-01 00:00:00 UTC" in err


def test_diff_reports_keys_added_removed_and_changed(lake, capsys):
    agg_path = f"{lake['lake']}/{PIPELINE}/aggregates"
    code, out, _ = run(capsys, "diff", AGG, "--pipeline", lake["spec_file"], "--from", "0", "--json",
                       "--limit", "10000")
    assert code == 0
    d = json.loads(out)
    assert (d["from_version"], d["to_version"], d["keys"]) == (0, 1, KEYS)
    old, new = frame(agg_path, 0), frame(agg_path, 1)
    old_keys = set(map(tuple, old[KEYS].astype(str).values))
    new_keys = set(map(tuple, new[KEYS].astype(str).values))
    assert d["counts"]["added"] == len(new_keys - old_keys) > 0
    assert d["counts"]["removed"] == len(old_keys - new_keys) > 0
    # only day 2 was recomputed: /a left it, /d came, /b and /c got other windows
    assert all(r["window_start"].startswith(D2) for r in d["added"] + d["removed"])
    assert "/d" in {r["page"] for r in d["added"]} and "/a" not in {r["page"] for r in d["added"]}
    assert "/a" in {r["page"] for r in d["removed"]} and "/d" not in {r["page"] for r in d["removed"]}
    merged = old.merge(new, on=KEYS, suffixes=(".old", ".new"))
    views_changed = merged[merged["views.old"] != merged["views.new"]]
    assert d["counts"]["changed"] >= len(views_changed) > 0
    assert d["counts"]["changed"] + d["counts"]["unchanged"] == len(merged)
    by_key = {(c["key"]["page"], c["key"]["window_start"]): c for c in d["changed"]}
    row = views_changed.iloc[0]
    change = by_key[(row["page"], row["window_start"].isoformat())]
    assert (change["old"]["views"], change["new"]["views"]) == (row["views.old"], row["views.new"])
    assert "updated_at" not in d["compared"] and "users__hll" not in d["compared"]

    code, text, _ = run(capsys, "diff", AGG, "--lake", lake["lake"], "--from", "0", "--to", "1", "--limit", "2")
    assert code == 0
    assert text.splitlines()[0] == f"diff {AGG} version 0 -> 1 (keys: page, window_start, window_end)"
    assert f"changed ({d['counts']['changed']}, first 2):" in text and " -> " in text

    code, text, _ = run(capsys, "diff", AGG, "--lake", lake["lake"], "--from", "1")
    assert code == 0 and "added 0, removed 0, changed 0" in text and "no differences" in text


def test_diff_of_partials_uses_batch_source_and_event_date_as_keys(lake, capsys):
    code, out, _ = run(capsys, "diff", PARTIALS, "--pipeline", lake["spec_file"], "--from", "1", "--to", "2", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["keys"] == ["batch", "source", "event_date", *KEYS]
    assert d["counts"]["added"] > 0 and d["counts"]["removed"] > 0
    assert {r["batch"] for r in d["added"]} == {D2}


def test_schema_and_partitions(lake, capsys):
    code, out, _ = run(capsys, "schema", PARTIALS, "--lake", lake["lake"], "--json")
    roles = {r["column"]: r["role"] for r in json.loads(out)}
    assert roles["event_date"] == "key, partition" and roles["page"] == "key"
    assert roles["views__count"] == "accumulator" and roles["run_id"] == "metadata" and roles["n_rows"] == "value"

    code, out, _ = run(capsys, "partitions", PARTIALS, "--lake", lake["lake"], "--json")
    parts = json.loads(out)
    actions = pa.table(DeltaTable(f"{lake['lake']}/{PIPELINE}/partials").get_add_actions(flatten=True)).to_pydict()
    assert [(p["event_date"], p["source"]) for p in parts] == [("2024-03-01", "batch"), (D2, "batch")]
    assert sum(p["rows"] for p in parts) == sum(actions["num_records"])

    code, out, _ = run(capsys, "partitions", AGG, "--lake", lake["lake"])
    assert code == 0
    assert out.splitlines()[0].split() == ["files", "rows", "bytes"]


def test_runs_reconcile_rows_in_with_aggregated_and_rejected(lake, capsys):
    code, out, _ = run(capsys, "runs", "--pipeline", lake["spec_file"], "--json")
    assert code == 0
    runs = json.loads(out)
    assert [r["job"] for r in runs] == ["combine", "combine", "reduce", "combine", "reduce"]
    assert all(r["reconciles"] for r in runs) and all(r["status"] == "success" for r in runs)
    combines = [r for r in runs if r["job"] == "combine"]
    assert all(r["rows_in"] == 42 and r["rows_rejected"] == 2 for r in combines)
    # the first combine of D2 was replaced by the rerun: its rejects left dead_letter with it
    assert [r["dead_letter_rows"] for r in combines] == [2, 0, 2]
    assert runs[-1]["read"].startswith("partials v2")

    code, text, _ = run(capsys, "runs", PIPELINE, "--lake", lake["lake"], "--limit", "2")
    lines = text.splitlines()
    assert len(lines) == 4 and "reconciles" in lines[0] and lines[2].split()[2] == "combine"


def test_a_table_can_be_given_by_path(lake, capsys):
    path = f"{lake['lake']}/{PIPELINE}/aggregates"
    code, out, _ = run(capsys, "history", path, "--json")
    assert code == 0 and [h["version"] for h in json.loads(out)] == [1, 0]


# ----------------------------------------------------------------------------- bad input
BAD = [
    (["show", f"{PIPELINE}.nope"], 4, "unknown table 'nope' in 'views.nope'; tables are partials, aggregates"),
    (["show", "nope.aggregates"], 4, "no Delta table nope.aggregates at"),
    (["show", AGG, "--version", "9"], 2, "version 9 of views.aggregates does not exist; its versions are 0..1"),
    (["show", AGG, "--version", "-1"], 2, "version -1 of views.aggregates does not exist"),
    (["diff", AGG, "--from", "5"], 2, "version 5 of views.aggregates does not exist; its versions are 0..1"),
    (["show", AGG, "--where", "1=1; DROP TABLE x"], 2, "bad filter at position 4: unexpected character ';'"),
    (["show", AGG, "--where", "page = 'x' OR 1=1"], 2,
     "bad filter at position 15: expected a column name, found the number 1"),
    (["show", AGG, "--where", "page = 'x'; DELETE FROM t"], 2, "unexpected character ';'"),
    (["show", AGG, "--where", "pgae = '/a'"], 2, "unknown column 'pgae'"),
    (["show", AGG, "--where", "views = '3'"], 2, "column 'views' is int64; expected a number"),
    (["show", AGG, "--where", "page = '/a' --"], 2, "unexpected character '-'"),
    (["show", AGG, "--where", "views > (SELECT 1)"], 2, "expected a number, found '('"),
    (["show", AGG, "--columns", "page,nope"], 2, "unknown columns 'nope' in views.aggregates"),
    (["show", AGG, "--order-by", "views:sideways"], 2, "bad --order-by 'views:sideways'"),
    (["show", AGG, "--limit", "0"], 2, "--limit must be at least 1, got 0"),
    (["show", AGG, "--as-of", "yesterday"], 2, "bad time 'yesterday'"),
    (["diff", AGG, "--from", "0", "--keys", "page"], 2, "are not unique in version 0 of views.aggregates"),
    (["history", "../../../etc"], 4, "no Delta table at ../../../etc"),
    (["show", "views/../../x.aggregates"], 4, "no Delta table at views/../../x.aggregates"),
    (["show", "../views.aggregates"], 4, "no Delta table at ../views.aggregates"),
    (["runs", "../etc"], 2, "bad pipeline name '../etc'"),
]


@pytest.mark.parametrize(("argv", "code", "message"), BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_input_gets_a_clear_error_and_changes_nothing(lake, capsys, argv, code, message):
    before = snapshot(lake["lake"])
    got, out, err = run(capsys, *argv, "--lake", lake["lake"])
    assert got == code, err
    assert out == ""
    assert err.startswith("error: ") and message in err
    assert snapshot(lake["lake"]) == before


def test_a_quoted_injection_is_only_a_string_value(lake, capsys):
    before = snapshot(lake["lake"])
    code, out, err = run(capsys, "show", AGG, "--lake", lake["lake"], "--where", "page = 'x''; DROP TABLE t; --'")
    assert (code, out.strip(), err) == (0, "(no rows)", "")
    assert snapshot(lake["lake"]) == before


def test_a_filter_error_points_at_the_position(lake, capsys):
    code, _, err = run(capsys, "show", AGG, "--lake", lake["lake"], "--where", "page = 'x' OR 1=1")
    assert code == 2
    assert err.splitlines()[1:3] == ["  page = 'x' OR 1=1", "                ^"]


def test_without_a_lake_the_error_says_how_to_give_one(capsys, monkeypatch):
    monkeypatch.delenv("SPARK_JOBS_LAKE", raising=False)
    code, _, err = run(capsys, "tables")
    assert code == 4 and "pass --lake DIR or --pipeline SPEC, or set $SPARK_JOBS_LAKE" in err
    assert not Path("views").exists()
