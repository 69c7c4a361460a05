"""``inspect rollup``: merges of the stored accumulators equal DuckDB's aggregation of the raw rows.

The lake is written once by the real jobs (combine and reduce in Spark) over three days; the rollups
then read it with delta-rs only. For random ranges of whole windows, grains and subsets of keys, each
rollup must equal the oracle: exact aggregates exactly, HLL within 3 × its relative standard error,
KLL within its rank error.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs.errors import InspectError
from spark_jobs.inspection.rollup import Rollup, rollup
from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables
from spark_jobs.lake.reader import open_table
from spark_jobs.phases.arrow_merge import bucket_origin
from spark_jobs.spec import PipelineSpec
from tests.builders import ALL_AGGREGATES, day_events, make_spec, write_day
from tests.oracle import aggregate_sql, rank_ok, read_landing, valid_rows

pytestmark = pytest.mark.spark

DAYS = ("2024-03-01", "2024-03-02", "2024-03-03")
T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory) -> tuple[PipelineSpec, Any]:
    root = tmp_path_factory.mktemp("rollup")
    spec = make_spec(root, window={"size": "1 hour"}, group_by=["page", "country"], aggregates=ALL_AGGREGATES)
    for i, day in enumerate(DAYS):
        write_day(root / "landing", day, day_events(day, 1500, seed=i, rejected=3), files=2)
        combine.run(spark, spec, day)
    reduce.run(spark, spec)
    rows = valid_rows(read_landing(root / "landing"), spec)
    return spec, rows.read_all() if hasattr(rows, "read_all") else rows


def oracle(rows: Any, spec: PipelineSpec, request: Rollup) -> pd.DataFrame:
    """DuckDB over the raw rows in [start, end), grouped by the keys and the bucket of each event."""
    con = duckdb.connect()
    con.register("rows", rows)
    et = spec.source.event_time
    start, end = (f"TIMESTAMPTZ '{t.isoformat()}'" for t in (request.start, request.end))
    origin = "" if request.grain_s is None else f"TIMESTAMPTZ '{bucket_origin(request.grain_s).isoformat()}'"
    bucket = start if request.grain_s is None else (
        f"greatest(time_bucket(INTERVAL {request.grain_s} SECOND, {et}, {origin}), {start})")
    select = [*request.by, f"{bucket} AS start", *aggregate_sql(spec)]
    select.append("count(*) AS n_rows")
    group = ", ".join([*request.by, "start"])
    sql = f"SELECT {', '.join(select)} FROM rows WHERE {et} >= {start} AND {et} < {end} GROUP BY {group}"
    df = con.sql(sql).df()
    df["start"] = pd.to_datetime(df["start"], utc=True)
    return df.sort_values([*request.by, "start"], na_position="first").reset_index(drop=True)


def assert_rollup(got: pd.DataFrame, want: pd.DataFrame, spec: PipelineSpec, by: tuple[str, ...]) -> None:
    got = got.sort_values([*by, "start"], na_position="first").reset_index(drop=True)
    assert len(got) == len(want), f"{len(got)} rollup rows, the oracle has {len(want)}"
    for k in [*by, "start"]:
        assert got[k].astype(str).tolist() == want[k].astype(str).tolist(), k
    assert got["n_rows"].tolist() == want["n_rows"].tolist()
    for agg in spec.aggregates:
        g, w = got[agg.name].tolist(), want[agg.name].tolist()
        if agg.fn == "approx_count_distinct":  # HLL at lg_k 12: RSE 1.04 / sqrt(4096)
            for a, b in zip(g, w, strict=True):
                assert abs(a - b) <= max(1, 3 * 0.0163 * b), f"{agg.name}: {a} vs exact {b}"
        elif agg.fn == "approx_percentile":
            for a, values in zip(g, w, strict=True):
                assert rank_ok(values, a, 0.9), f"{agg.name}: {a}"
        elif agg.fn == "avg" or agg.user_defined:
            np.testing.assert_allclose(np.array(g, dtype=float), np.array(w, dtype=float), rtol=1e-9, equal_nan=True)
        else:
            assert [None if pd.isna(x) else x for x in g] == [None if pd.isna(x) else x for x in w], agg.name


GRAINS = [None, 3600, 6 * 3600, 86_400, 7 * 86_400]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.integers(0, 71), hours=st.integers(1, 72), grain=st.sampled_from(GRAINS),
       by=st.sampled_from([("page", "country"), ("page",), ("country",), ()]))
def test_any_range_grain_and_keys_equal_the_oracle(lake, first, hours, grain, by):
    spec, rows = lake
    start = T0 + dt.timedelta(hours=first)
    request = Rollup(start, start + dt.timedelta(hours=hours), by, grain)
    got = rollup(open_table(PipelineTables(spec.lake, spec.name).aggregates), spec, request).to_pandas()
    assert_rollup(got, oracle(rows, spec, request), spec, by)


@pytest.mark.parametrize(("request_", "message"), [
    (Rollup(T0 + dt.timedelta(minutes=30), T0 + dt.timedelta(hours=2), ("page",)), "--from 2024-03-01 00:30:00 cuts a"),
    (Rollup(T0, T0 + dt.timedelta(hours=2), ("browser",)), "unknown key 'browser' in --by"),
    (Rollup(T0, T0, ("page",)), "is not after --from"),
    (Rollup(T0, T0 + dt.timedelta(hours=5), ("page",), 1800), "is not a whole number of 1 hour windows"),
    (Rollup(T0, T0 + dt.timedelta(hours=5), ("page",), None, "views > 3"), "unknown column 'views'"),
])
def test_requests_the_windows_cannot_answer_are_clear_errors(lake, request_, message):
    spec, _ = lake
    with pytest.raises(InspectError, match=message):
        rollup(open_table(PipelineTables(spec.lake, spec.name).aggregates), spec, request_)


def test_the_cli_rolls_up_a_filtered_key_by_day_as_json(lake):
    spec, rows = lake
    proc = subprocess.run([sys.executable, "-m", "spark_jobs", "inspect", "rollup", f"{spec.name}.aggregates",
                           "--pipeline", spec.origin, "--from", "2024-03-01", "--to", "2024-03-03", "--by", "page",
                           "--grain", "1 day", "--where", "page = '/a'", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    want = oracle(rows, spec, Rollup(T0, T0 + dt.timedelta(days=2), ("page",), 86_400))
    want = want[want["page"] == "/a"]
    assert [(r["start"][:10], r["views"], r["n_rows"]) for r in got] == [
        (str(s)[:10], v, n) for s, v, n in zip(want["start"], want["views"], want["n_rows"], strict=True)]
    bad = subprocess.run([sys.executable, "-m", "spark_jobs", "inspect", "rollup", f"{spec.name}.aggregates",
                          "--pipeline", spec.origin, "--from", "2024-03-01", "--to", "2024-03-02", "--grain", "2 fortnights"],
                         cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "bad grain '2 fortnights'" in bad.stderr
