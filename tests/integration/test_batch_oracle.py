"""combine + reduce equals a direct aggregation of the raw rows, for any split into batches."""

from __future__ import annotations

import datetime as dt
import itertools
import shutil

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables
from tests.builders import events, make_spec, write_day
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark
DAY0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)

row = st.tuples(
    st.integers(0, 2),                                   # day
    st.integers(0, 86_399),                              # second of the day
    st.sampled_from(["u1", "u2", "u3", "u4", "u5", None]),
    st.sampled_from(["/a", "/b", "/c"]),
    st.one_of(st.none(), st.integers(0, 10_000)),
    st.sampled_from([0.5, 1.0, 2.25]),
    st.sampled_from(["DE", "US", None]),
)


def _tables(rows):
    by_day = {}
    for day, sec, user, page, ms, w, country in rows:
        at = DAY0 + dt.timedelta(days=day, seconds=sec)
        by_day.setdefault(day, []).append((at, user, page, ms, w, country))
    return {(DAY0 + dt.timedelta(days=d)).date().isoformat(): events(r) for d, r in by_day.items()}


@settings(max_examples=6, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=st.lists(row, min_size=1, max_size=60), files=st.integers(1, 3), order=st.randoms(use_true_random=False),
       window=st.sampled_from([None, {"size": "1 hour"}, {"size": "2 hours", "slide": "30 minutes"}]),
       reduce_between=st.booleans())
def test_any_split_into_days_and_files_gives_the_oracle(spark, tmp_path_factory, rows, files, order, window,
                                                        reduce_between):
    root = tmp_path_factory.mktemp("prop")
    spec = make_spec(root, window=window)
    days = _tables(rows)
    for date, table in days.items():
        write_day(root / "landing", date, table, files=min(files, table.num_rows))
    dates = list(days)
    order.shuffle(dates)
    for i, date in enumerate(dates):
        combine.run(spark, spec, date)
        if reduce_between and i == 0:
            reduce.run(spark, spec)
    reduce.run(spark, spec)
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(root / "landing"), spec), spec)
    shutil.rmtree(root)


@pytest.mark.parametrize("window", [None, {"size": "1 hour"}, {"size": "1 hour", "slide": "20 minutes"}])
def test_generated_days_match_the_oracle(spark, tmp_path, window):
    from spark_jobs.jobs.generate import GenerateConfig, generate

    spec = make_spec(tmp_path, window=window)
    generate(GenerateConfig(out=str(tmp_path / "landing"), days=2, rows_per_day=3000, pages=20, users=300,
                            bad_fraction=0.01), progress=False)
    records = [combine.run(spark, spec, d) for d in ("2024-03-01", "2024-03-02")]
    for r in records:
        assert r.rows_in == 3000 and r.rows_rejected > 0 and r.rows_in == r.rows_aggregated + r.rows_rejected
    reduce.run(spark, spec)
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(tmp_path / "landing"), spec), spec)


def test_a_global_aggregate_without_keys(spark, tmp_path):
    spec = make_spec(tmp_path, group_by=[])
    rows = [(DAY0 + dt.timedelta(minutes=i), f"u{i % 3}", "/a", i, 1.0, "DE") for i in range(50)]
    write_day(tmp_path / "landing", "2024-03-01", events(rows), files=2)
    combine.run(spark, spec, "2024-03-01")
    reduce.run(spark, spec)
    got = actual(PipelineTables(spec.lake, spec.name).aggregates, spec)
    assert got["views"].tolist() == [50] and got["total_ms"].tolist() == [sum(range(50))]
    assert got["first_user"].tolist() == ["u0"] and got["last_user"].tolist() == ["u1"]


def test_days_of_only_rejected_rows_aggregate_nothing(spark, tmp_path):
    spec = make_spec(tmp_path)
    write_day(tmp_path / "landing", "2024-03-01", events([(None, "u1", "/a", 1, 1.0, "DE"),
                                                          (DAY0 + dt.timedelta(days=1), "u1", "/a", 1, 1.0, "DE")]))
    record = combine.run(spark, spec, "2024-03-01")
    assert (record.rows_in, record.rows_aggregated, record.rows_rejected) == (2, 0, 2)
    reduce.run(spark, spec)
    assert len(actual(PipelineTables(spec.lake, spec.name).aggregates, spec)) == 0


def test_the_oracle_itself_is_not_vacuous(tmp_path):
    spec = make_spec(tmp_path, window={"size": "1 hour"})
    table = events([(DAY0 + dt.timedelta(minutes=m), "u", p, m, 1.0, "DE")
                    for m, p in itertools.product(range(0, 180, 7), ["/a", "/b"])])
    table = table.append_column("event_date", pa.array(["2024-03-01"] * table.num_rows))
    want = expected(table, spec)
    assert len(want) == 6 and want["views"].sum() == table.num_rows
