"""Independent answers for the tests: DuckDB and pandas over the raw landing rows."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from spark_jobs.spec import PipelineSpec
from spark_jobs.windows import Cumulative, Hopping, Sessions, Tumbling

EXACT_SQL = {
    "count": lambda c: f"count({c or '*'})",
    "sum": lambda c: f"sum({c})",
    "min": lambda c: f"min({c})",
    "max": lambda c: f"max({c})",
    "avg": lambda c: f"avg({c})",
    "count_distinct": lambda c: f"count(DISTINCT {c})",
    "approx_count_distinct": lambda c: f"count(DISTINCT {c})",  # exact count, compared with a bound
    "approx_percentile": lambda c: f"list({c}) FILTER (WHERE {c} IS NOT NULL)",  # values, for a rank check
}


def valid_rows(raw: pa.Table, spec: PipelineSpec) -> pa.Table:
    """The rows the pipeline must aggregate: event time present (keys too with ``null_keys: reject``; else a NULL key
    is a group, as DuckDB's GROUP BY makes it), in their partition's day."""
    con = duckdb.connect()
    con.register("raw", raw)
    keys = spec.group_by if spec.source.null_keys == "reject" else ()
    cond = " AND ".join([f"{spec.source.event_time} IS NOT NULL", *(f"{k} IS NOT NULL" for k in keys),
                         f"CAST(timezone('UTC', {spec.source.event_time}) AS DATE) = CAST(event_date AS DATE)"])
    return con.sql(f"SELECT * FROM raw WHERE {cond}").arrow()


def live_rows(rows: Any, spec: PipelineSpec) -> Any:
    """A changelog source's rows live after its retractions: each -U/-D row cancels an +I/+U row of the same values
    (event time aside), the earliest first; other change kinds are left out, as the jobs reject them. Windowed, the
    product retracts in the window of the -U/-D row's own event time: a pair must share a window for both to agree.
    Other sources: ``rows`` as they are."""
    op, et = spec.source.op_column, spec.source.event_time
    if op is None:
        return rows
    same = ", ".join(c for c, _ in spec.source.schema if c not in (op, et)) or "1"
    con = duckdb.connect()
    con.register("rows", rows)
    return con.sql(
        f"SELECT * EXCLUDE (_sign, _live, _nth) FROM (SELECT *, sum(_sign) OVER (PARTITION BY {same}) AS _live,"
        f" row_number() OVER (PARTITION BY {same}, _sign ORDER BY {et} DESC) AS _nth"
        f" FROM (SELECT *, CASE WHEN {op} IN ('-U', '-D') THEN -1 WHEN {op} IN ('+I', '+U') THEN 1 END"
        " AS _sign FROM rows))"
        " WHERE _sign = 1 AND _nth <= _live").arrow().read_all()


def read_landing(path: str | Path) -> pa.Table:
    """Every landing row with its partition's event_date."""
    tables = []
    for part in sorted(Path(path).glob("event_date=*")):
        for f in sorted(part.glob("*.parquet")):
            t = pq.read_table(f)
            tables.append(t.append_column("event_date", pa.array([part.name.split("=")[1]] * t.num_rows)))
    return pa.concat_tables(tables, promote_options="default")


def expected(raw: pa.Table, spec: PipelineSpec) -> pd.DataFrame:
    """The aggregates table a correct pipeline produces, from the raw rows."""
    rows = live_rows(valid_rows(raw, spec), spec)
    con = duckdb.connect()
    con.register("rows", rows)
    et = spec.source.event_time
    keys = list(spec.group_by)
    source = "rows"
    window = spec.window
    if isinstance(window, Sessions):
        source = _sessions_sql(spec, "rows")
        keys += ["window_start", "window_end"]
    elif isinstance(window, (Tumbling, Hopping)):
        size = window.size.seconds
        slide = window.slide.seconds if isinstance(window, Hopping) else size
        n = -(-size // slide)
        source = (
            f"(SELECT *, ws AS window_start, ws + INTERVAL {size} SECOND AS window_end FROM ("
            f" SELECT *, time_bucket(INTERVAL {slide} SECOND, {et}, TIMESTAMPTZ '1970-01-01 00:00:00+00')"
            f"   - INTERVAL (k * {slide}) SECOND AS ws FROM rows, range({n}) t(k))"
            f" WHERE ws <= {et} AND {et} < ws + INTERVAL {size} SECOND)"
        )
        keys += ["window_start", "window_end"]
    elif isinstance(window, Cumulative):  # every window of the event's bucket that ends after it
        size, step = window.size.seconds, window.step.seconds
        source = (
            f"(SELECT *, b AS window_start, b + INTERVAL (k * {step}) SECOND AS window_end FROM ("
            f" SELECT *, time_bucket(INTERVAL {size} SECOND, {et}, TIMESTAMPTZ '1970-01-01 00:00:00+00') AS b"
            f" FROM rows), range(1, {size // step + 1}) t(k) WHERE {et} < b + INTERVAL (k * {step}) SECOND)"
        )
        keys += ["window_start", "window_end"]
    select = [*keys, *aggregate_sql(spec)]
    select.append("count(*) AS n_rows")
    group = f"GROUP BY {', '.join(keys)}" if keys else ""
    df = con.sql(f"SELECT {', '.join(select)} FROM {source} {group}").df()
    return _normalise(df, keys)


def _sessions_sql(spec: PipelineSpec, rows: str) -> str:
    """Gaps and islands: per key, a new session when an event is more than ``gap`` after the one before it;
    the session is [first event, last event + gap)."""
    assert isinstance(spec.window, Sessions)
    et, gap = spec.source.event_time, spec.window.gap.seconds
    part = f"PARTITION BY {', '.join(spec.group_by)}" if spec.group_by else ""
    return (
        f"(SELECT *, min({et}) OVER (PARTITION BY {', '.join([*spec.group_by, 'sid'])}) AS window_start,"
        f" max({et}) OVER (PARTITION BY {', '.join([*spec.group_by, 'sid'])}) + INTERVAL {gap} SECOND AS window_end"
        f" FROM (SELECT *, sum(CASE WHEN prev IS NULL OR epoch_us({et}) - epoch_us(prev) > {gap * 1_000_000}"
        f"   THEN 1 ELSE 0 END) OVER ({part} ORDER BY {et} ROWS UNBOUNDED PRECEDING) AS sid"
        f" FROM (SELECT *, lag({et}) OVER ({part} ORDER BY {et}) AS prev FROM {rows})))"
    )


def aggregate_sql(spec: PipelineSpec) -> list[str]:
    """DuckDB's select expressions for the spec's aggregates over raw rows (``<expr> AS <name>``)."""
    et = spec.source.event_time
    out = []
    for agg in spec.aggregates:
        col = agg.columns[0] if agg.columns else None
        if agg.fn in EXACT_SQL:
            out.append(f"{EXACT_SQL[agg.fn](col)} AS {agg.name}")
        elif agg.fn in ("first", "last"):
            pick = "arg_min" if agg.fn == "first" else "arg_max"
            out.append(f"{pick}({col}, ({et}, {col})) FILTER (WHERE {col} IS NOT NULL) AS {agg.name}")
        elif agg.fn.endswith(":WeightedAvg"):
            v, w = agg.columns
            both = f"{v} IS NOT NULL AND {w} IS NOT NULL"
            out.append(f"sum({v} * {w}) FILTER (WHERE {both}) / NULLIF(sum({w}) FILTER (WHERE {both}), 0) "
                       f"AS {agg.name}")
        else:
            raise ValueError(f"no oracle for {agg.fn}")
    return out


def _normalise(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    for k in ("window_start", "window_end"):
        if k in df:
            df[k] = pd.to_datetime(df[k], utc=True).dt.tz_convert("UTC")
    return df.sort_values(keys, na_position="first").reset_index(drop=True) if keys else df


def actual(path: str, spec: PipelineSpec, version: int | None = None) -> pd.DataFrame:
    """The aggregates table as written (at ``version``), read with delta-rs (not Spark)."""
    df = DeltaTable(path, version=version).to_pandas()
    return _normalise(df, list(spec.key_columns))


def rank_ok(values: Any, got: Any, q: float, eps: float = 0.03) -> bool:
    """``got`` is a value whose normalised rank in ``values`` is within ``eps`` of ``q``."""
    if values is None or values is pd.NA or (isinstance(values, float) and np.isnan(values)):
        values = []
    arr = np.sort(np.asarray(list(values), dtype=float))
    if got is None or got is pd.NA or (isinstance(got, float) and np.isnan(got)):
        return len(arr) == 0
    lo = np.searchsorted(arr, got, side="left") / len(arr)
    hi = np.searchsorted(arr, got, side="right") / len(arr)
    return lo - eps <= q <= hi + eps


def assert_matches(got: pd.DataFrame, want: pd.DataFrame, spec: PipelineSpec) -> None:
    """Exact aggregates equal, sketches within their bounds, same key set."""
    keys = list(spec.key_columns)
    assert len(got) == len(want), f"{len(got)} aggregate rows, oracle has {len(want)}"
    if keys:
        left = got[keys].astype(str).reset_index(drop=True)
        right = want[keys].astype(str).reset_index(drop=True)
        pd.testing.assert_frame_equal(left, right, check_dtype=False)
    assert list(got["n_rows"]) == list(want["n_rows"])
    for agg in spec.aggregates:
        g, w = got[agg.name].tolist(), want[agg.name].tolist()
        if agg.fn == "approx_count_distinct":
            for a, b in zip(g, w, strict=True):
                assert abs(a - b) <= max(2, 0.05 * b), f"{agg.name}: {a} vs exact {b}"
        elif agg.fn == "approx_percentile":
            for a, values in zip(g, w, strict=True):
                assert rank_ok(values, a, float(agg.arg("q"))), f"{agg.name}: {a} is not near q of {sorted(values)[:20]}"
        elif agg.fn in ("avg",) or agg.user_defined:
            np.testing.assert_allclose(np.array(g, dtype=float), np.array(w, dtype=float), rtol=1e-9, equal_nan=True)
        else:
            gs = [None if pd.isna(x) else (x.isoformat() if isinstance(x, (dt.datetime, pd.Timestamp)) else x) for x in g]
            ws = [None if pd.isna(x) else (x.isoformat() if isinstance(x, (dt.datetime, pd.Timestamp)) else x) for x in w]
            assert gs == ws, f"{agg.name} differs: first mismatches {[(a, b) for a, b in zip(gs, ws, strict=True) if a != b][:5]}"
