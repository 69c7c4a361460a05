"""Lake maintenance: compaction, vacuum and checkpoint leave every table's content, and reduce's result, unchanged."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from spark_jobs.__main__ import main
from spark_jobs.errors import LakeError
from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables, open_lake
from spark_jobs.lake.maintenance import maintain
from spark_jobs.lake.table_rules import PARTIALS_PARTITIONS
from tests.builders import FAST_AGGREGATES, day_events, make_spec, write_day
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

DAYS = ("2024-03-01", "2024-03-02")


def small_files_lake(spark, tmp_path):
    """Two days combined and reduced, each day's partials then spread over 4 small files (as streaming leaves them)."""
    spec = make_spec(tmp_path, window={"size": "1 hour"}, aggregates=FAST_AGGREGATES,
                     rollups=[{"name": "daily", "grain": "1 day", "by": ["page"]}])
    tables = PipelineTables(spec.lake, spec.name)
    for i, day in enumerate(DAYS):
        write_day(tmp_path / "landing", day, day_events(day, 400, seed=i, rejected=2), files=4)
        combine.run(spark, spec, day)
    reduce.run(spark, spec)
    lake = open_lake(spark)
    for day in DAYS:
        part = {"event_date": day, "source": "batch"}
        files = [f.path for f in lake.files(tables.partials) if f.partition_values == part]
        rows = lake.read_files(tables.partials, files).repartition(4)
        lake.replace_partition(rows, tables.partials, partition_by=PARTIALS_PARTITIONS, partition=part)
    reduce.run(spark, spec)
    return spec, tables


def content(path: str, keys: list[str]) -> list[dict]:
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in keys))


@pytest.mark.parametrize("retention", [168, 0], ids=["keep-removed-files", "vacuum-removed-files"])
def test_maintenance_keeps_the_tables_and_the_next_reduce_is_unchanged(spark, tmp_path, retention):
    spec, tables = small_files_lake(spark, tmp_path)
    oracle = expected(read_landing(tmp_path / "landing"), spec)
    assert_matches(actual(tables.aggregates, spec), oracle, spec)
    keys = ["event_date", "source", "page", "window_start"]
    partials_before = content(tables.partials, keys)
    daily = tables.rollup("daily")
    counts_before = [(r["page"], r["window_start"], r["n_rows"]) for r in content(daily, ["page", "window_start"])]
    report = {m.table: m for m in maintain(spec.lake, spec.name, retention_hours=retention,
                                           enforce_retention=retention >= 168)}
    aggregates_version = DeltaTable(tables.aggregates).version()  # a vacuum that deletes files logs commits
    assert set(report) == {"partials", "aggregates", "changelog", "dead_letter", "runs", "specs", "rollup_daily"}
    assert report["partials"].compacted["numFilesRemoved"] > report["partials"].compacted["numFilesAdded"] > 0
    assert report["aggregates"].compacted == report["rollup_daily"].compacted == {}  # reduce keeps their layout
    assert all(m.checkpoint for m in report.values())
    assert (len(report["partials"].vacuumed) > 0) == (retention == 0)
    assert content(tables.partials, keys) == partials_before  # the same rows, in fewer files
    # the compaction commit changes partials' files, not their rows: reduce re-merges and gets the same answer
    record = reduce.run(spark, spec)
    assert record.status == "success"
    if retention == 0:  # the replaced partial files are gone: reduce cannot diff, so it merges everything
        assert record.message == "full merge"
    assert DeltaTable(tables.aggregates).version() == aggregates_version + 1
    assert_matches(actual(tables.aggregates, spec), oracle, spec)
    assert [(r["page"], r["window_start"], r["n_rows"]) for r in content(daily, ["page", "window_start"])] == \
        counts_before
    assert reduce.run(spark, spec).status == "noop"


def test_a_short_retention_is_refused_unless_allowed(spark, tmp_path, capsys):
    spec, _ = small_files_lake(spark, tmp_path)
    with pytest.raises(LakeError, match="--retention-hours 1 is below the safe minimum of 168 hours"):
        maintain(spec.lake, spec.name, retention_hours=1)
    assert main(["maintain", "--pipeline", spec.origin, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "(dry run) partials: not compacted" in out
    assert main(["maintain", "--pipeline", spec.origin, "--retention-hours", "1"]) == 4
