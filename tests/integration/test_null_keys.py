"""A NULL group key is a group of its own, as SQL's GROUP BY, Flink, Spark and DuckDB make it: in the batch, both
stream engines, sessions, the changelog, rollups and ``inspect rollup``, against DuckDB over the raw rows.
``source.null_keys: reject`` keeps today's rejects, and ``plan`` lists the days a change back to ``group`` recounts."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from spark_jobs.inspection.rollup import Rollup, rollup
from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables
from spark_jobs.lake.reader import open_table
from spark_jobs.lake.spec_record import read_records
from spark_jobs.spec import PipelineSpec
from spark_jobs.spec_plan import make_plan
from spark_jobs.stream import query as stream
from tests.builders import FAST_AGGREGATES, day_events, events, make_spec, write_day
from tests.integration.test_stream import land_sliced, with_stream
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

D1 = "2024-03-01"
T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
ROLLUPS = [{"name": "by_country", "grain": "1 day", "by": ["country"]}, {"name": "total", "grain": "1 day", "by": []}]


def _oracle(spec: PipelineSpec) -> Any:
    return expected(read_landing(spec.source.path), spec)


def _served(spec: PipelineSpec) -> Any:
    return actual(PipelineTables(spec.lake, spec.name).aggregates, spec)


def test_the_batch_serves_and_rolls_up_the_null_group_and_the_totals_equal_count_star(spark, tmp_path):
    spec = make_spec(tmp_path, window={"size": "1 hour"}, group_by=["page", "country"], aggregates=FAST_AGGREGATES,
                     rollups=ROLLUPS)
    rows = day_events(D1, 400, seed=3, rejected=5)  # a quarter of the rows have no country; 5 have no event time
    write_day(tmp_path / "landing", D1, rows, files=2)
    record = combine.run(spark, spec, D1)
    assert record.rows_rejected == 5
    reduce.run(spark, spec)
    got = _served(spec)
    assert got["country"].isna().sum() > 0
    assert_matches(got, _oracle(spec), spec)
    counted = rows.num_rows - 5
    tables = PipelineTables(spec.lake, spec.name)
    total = open_table(tables.rollup("total")).read()
    assert pc.sum(total.column("views")).as_py() == counted  # rollup by: [] is count(*)
    by_country = open_table(tables.rollup("by_country")).read()
    nulls = by_country.filter(pc.is_null(by_country.column("country")))
    assert pc.sum(nulls.column("views")).as_py() == pc.sum(pc.is_null(rows.column("country")).cast(pa.int64())).as_py()
    served = open_table(tables.aggregates)
    everything = rollup(served, spec, Rollup(T0, T0 + dt.timedelta(days=1), ()))  # inspect rollup --by ''
    assert pc.sum(everything.column("views")).as_py() == counted
    countries = rollup(served, spec, Rollup(T0, T0 + dt.timedelta(days=1), ("country",))).to_pylist()
    assert {r["country"] for r in countries} == {"DE", "US", "FR", None}


@pytest.mark.parametrize("engine", ["driver", "spark"])
@pytest.mark.parametrize("window", [{"size": "1 hour"}, {"gap": "30 minutes"}], ids=["tumbling", "sessions"])
def test_the_stream_groups_null_keys_as_the_batch_does_and_its_changelog_folds_to_them(spark, tmp_path, engine,
                                                                                       window):
    group = ["country"] if "size" in window else ["user_id"]
    spec = with_stream(make_spec(tmp_path, window=window, group_by=group, aggregates=FAST_AGGREGATES),
                       max_files_per_batch=1, watermark="1 day")
    rows = day_events(D1, 300, seed=4)
    if group == ["user_id"]:  # a tenth of the events have no user: they form sessions of their own
        users = rows.column("user_id").to_pylist()
        rows = rows.set_column(1, "user_id", pa.array([None if i % 10 == 0 else u for i, u in enumerate(users)]))
    land_sliced(tmp_path / "landing", D1, rows, files=3)
    stream.run(spark, spec, available_now=True, driver_max_keys=0 if engine == "spark" else 100_000)
    got = _served(spec)
    assert got[group[0]].isna().sum() > 0
    assert_matches(got, _oracle(spec), spec)
    assert _folded(spec) == {tuple(_key(r[c]) for c in spec.key_columns): r["views"] for r in got.to_dict("records")}
    combine.run(spark, spec, D1)
    reduce.run(spark, spec)
    assert_matches(_served(spec), _oracle(spec), spec)


def _key(v: Any) -> Any:
    return None if v is None or v != v else v


def _folded(spec: PipelineSpec) -> dict[tuple[Any, ...], int]:
    """The changelog applied in order, by identity: views."""
    log = DeltaTable(PipelineTables(spec.lake, spec.name).changelog).to_pandas().sort_values(["batch_id", "seq"])
    identity = spec.window.identity(spec.group_by)
    out: dict[tuple[Any, ...], Any] = {}
    for row in log.to_dict("records"):
        key = tuple(_key(row[c]) for c in identity)
        if row["op"] in ("+I", "+U"):
            out[key] = (row, row["views"])
        else:
            out.pop(key, None)
    return {tuple(_key(r[c]) for c in spec.key_columns): views for r, views in out.values()}


def test_reject_keeps_the_rows_out_and_plan_recounts_their_days_once_null_keys_group(spark, tmp_path):
    spec = make_spec(tmp_path, window={"size": "1 hour"}, group_by=["country"], aggregates=FAST_AGGREGATES,
                     null_keys="reject")
    rows = events([(T0.replace(hour=h), "u", "/a", 1, 1.0, c) for h, c in ((1, "DE"), (2, None), (3, None))])
    write_day(tmp_path / "landing", D1, rows)
    write_day(tmp_path / "landing", "2024-03-02", events([(T0 + dt.timedelta(days=1), "u", "/a", 1, 1.0, "US")]))
    assert combine.run(spark, spec, D1).rows_rejected == 2
    combine.run(spark, spec, "2024-03-02")
    reduce.run(spark, spec)
    dead = DeltaTable(PipelineTables(spec.lake, spec.name).dead_letter).to_pandas()
    assert list(dead["reason"]) == ["group key country is missing"] * 2
    assert _served(spec)["country"].notna().all()
    grouped = make_spec(tmp_path, window={"size": "1 hour"}, group_by=["country"], aggregates=FAST_AGGREGATES)
    plan = make_plan(grouped, read_records(spec.lake, spec.name))
    assert [c.what for c in plan.diff.changes] == ["source.null_keys reject -> group"]
    assert [d.date for d in plan.days] == [D1]  # the day whose dead letters hold NULL-key rows, not 2024-03-02
    back = make_plan(spec, read_records(spec.lake, spec.name))
    assert not back.diff.changes

