"""The tables a run leaves are plain Delta: delta-rs, DuckDB and DataSketches read them without Spark."""

from __future__ import annotations

import json
import math

import datasketches as ds
import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from spark_jobs.jobs import combine, reduce
from spark_jobs.jobs.generate import GenerateConfig, generate
from spark_jobs.lake import PipelineTables
from tests.builders import FAST_AGGREGATES, make_spec
from tests.oracle import read_landing

pytestmark = pytest.mark.spark

DATES = ("2024-03-01", "2024-03-02")
ROWS_PER_DAY = 1000


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """Two generated days (with rejects) combined and reduced once; the tests only read."""
    root = tmp_path_factory.mktemp("readers")
    spec = make_spec(root, aggregates=FAST_AGGREGATES)
    generate(GenerateConfig(out=str(root / "landing"), days=len(DATES), rows_per_day=ROWS_PER_DAY, pages=15,
                            users=400, bad_fraction=0.01), progress=False)
    combines = [combine.run(spark, spec, d) for d in DATES]
    reduced = reduce.run(spark, spec)
    return {"root": root, "spec": spec, "tables": PipelineTables(spec.lake, spec.name),
            "combines": combines, "reduce": reduced}


@pytest.mark.parametrize("name", ["partials", "aggregates", "dead_letter", "runs"])
def test_every_table_opens_with_delta_rs_and_its_stats_count_its_rows(lake, name):
    dt = DeltaTable(lake["tables"].path(name))
    rows = dt.to_pyarrow_table().num_rows
    actions = pa.table(dt.get_add_actions(flatten=True))
    assert rows > 0
    assert rows == pc.sum(actions["num_records"]).as_py()


def test_duckdb_reads_the_aggregates_snapshot_from_its_file_list(lake):
    dt = DeltaTable(lake["tables"].aggregates)
    want = dt.to_pyarrow_table()
    files = dt.file_uris()
    assert files
    count, views = duckdb.connect().execute("SELECT count(*), sum(views) FROM read_parquet(?)", [files]).fetchone()
    assert count == want.num_rows
    assert views == pc.sum(want["views"]).as_py()
    valid = sum(r.rows_aggregated for r in lake["combines"])
    assert views == valid  # count(*) over every valid row, counted once


def test_sketch_accumulators_are_portable_datasketches_bytes(lake):
    rows = DeltaTable(lake["tables"].aggregates).to_pyarrow_table().to_pylist()
    rows = [r for r in rows if r["p90_ms__kll"] is not None]
    assert len(rows) >= 5
    big = max(rows, key=lambda r: r["n_rows"])
    assert big["n_rows"] > 200, "one key should need a compacted (estimation mode) KLL sketch"
    for r in rows:
        hll = ds.hll_sketch.deserialize(bytes(r["users__hll"]))
        assert math.floor(hll.get_estimate() + 0.5) == r["users"], (r["page"], hll.get_estimate(), r["users"])

        kll = ds.kll_doubles_sketch.deserialize(bytes(r["p90_ms__kll"]))
        assert kll.n == r["timed"]
        candidates = {int(kll.get_quantile(0.9)), int(kll.get_quantile(0.9, inclusive=True))}
        assert r["p90_ms"] in candidates, (r["page"], candidates, r["p90_ms"])

        assert isinstance(r["total_ms__sum"], int) and isinstance(r["total_ms__count"], int)
        assert r["total_ms"] == r["total_ms__sum"] and r["total_ms__count"] == r["timed"]
        assert r["avg_ms"] == pytest.approx(r["avg_ms__sum"] / r["avg_ms__count"])


def test_the_reduce_app_transaction_is_the_partials_version_it_merged(lake):
    tables, spec = lake["tables"], lake["spec"]
    partials_version = DeltaTable(tables.partials).version()
    assert DeltaTable(tables.aggregates).transaction_version(f"{spec.name}.reduce") == partials_version
    assert lake["reduce"].versions_read["partials"] == partials_version
    assert DeltaTable(tables.aggregates).transaction_version("someone-else.reduce") is None


def test_commits_carry_the_run_in_their_commit_info(lake):
    last = lake["combines"][-1]
    info = DeltaTable(lake["tables"].partials).history(1)[0]
    assert info["run_id"] == last.run_id
    assert info["job"] == "combine" and info["batch"] == DATES[-1]
    assert json.loads(info["inputs"]) == [lake["spec"].source.partition_path(DATES[-1])]
    agg_info = DeltaTable(lake["tables"].aggregates).history(1)[0]
    assert agg_info["run_id"] == lake["reduce"].run_id and agg_info["job"] == "reduce"


def test_runs_has_one_reconciled_row_per_run(lake):
    runs = DeltaTable(lake["tables"].runs).to_pyarrow_table().to_pylist()
    by_id = {r["run_id"]: r for r in runs}
    assert len(runs) == len(by_id) == 3
    landing = read_landing(lake["root"] / "landing")
    for record, date in zip(lake["combines"], DATES, strict=True):
        row = by_id[record.run_id]
        assert (row["job"], row["batch"], row["status"], row["pipeline"]) == ("combine", date, "success", "views")
        assert row["rows_in"] == row["rows_aggregated"] + row["rows_rejected"]
        assert row["rows_in"] == pc.sum(pc.equal(landing["event_date"], date)).as_py() == ROWS_PER_DAY
        assert row["rows_rejected"] > 0
        assert json.loads(row["versions_written"])["partials"] == record.versions_written["partials"]
    dead = DeltaTable(lake["tables"].dead_letter).to_pyarrow_table()
    assert dead.num_rows == sum(r.rows_rejected for r in lake["combines"])
    red = by_id[lake["reduce"].run_id]
    assert (red["job"], red["status"], red["batch"]) == ("reduce", "success", None)
    assert red["rows_in"] == DeltaTable(lake["tables"].partials).to_pyarrow_table().num_rows
