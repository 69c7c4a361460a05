"""The stream's two merge engines write the same tables, byte for byte.

Random mini-batches (sizes, event times, an insert-only or a changelog source, a batch combine
of the day in between so the hybrid rule applies) run once with every batch merged in Spark
and once with the driver engine taking every batch it accepts. Every table the stream writes
(``aggregates``, ``changelog``, ``partials``, its state) must then hold the same rows:

- HLL sketches by their content, byte for byte: a DataSketches HLL union is deterministic in what
  it holds, in Java (Spark) and C++ (the driver) alike: the same coupons in list and set modes
  (a set's slot order follows insertion order, so coupons are compared sorted) and the same
  register bytes in HLL mode;
- KLL sketches within their rank error: compaction picks its survivors at random, in both
  engines, so two merges of the same values keep different (equally valid) samples. Below the
  first compaction (n <= k) both hold every value and are compared value for value (their bytes
  differ only in whether level 0 is flagged as sorted);
- percentiles exactly while their sketch holds every value (each test window holds fewer than
  k = 200, so the changelog's values compare exactly too), else within the rank error;
- sets (``count_distinct``) and maps (min/max over a changelog) as sets of entries: their order
  carries no meaning, and Spark's is that of its shuffle.
"""

from __future__ import annotations

import datetime as dt
import os
import random
from pathlib import Path
from typing import Any

import datasketches as ds
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from spark_jobs.jobs import combine
from spark_jobs.lake import PipelineTables
from spark_jobs.spec import PipelineSpec
from spark_jobs.stream import query as stream
from tests.builders import ALL_AGGREGATES, FAST_AGGREGATES, day_events, events, make_spec
from tests.integration.test_stream import cdc_rows, cdc_spec, land, with_stream

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DAY = "2024-03-01"
UNORDERED = ("__set", "__counts")
# Random runs per kind: each streams every batch twice through Spark (minutes with a UDAF); CI takes one,
# ENGINE_EXAMPLES=n takes more
EXAMPLES = int(os.environ.get("ENGINE_EXAMPLES", "1"))
WINDOWS = {"hopping": {"size": "1 hour", "slide": "20 minutes"}, "cumulative": {"size": "1 day", "step": "2 hours"}}  # count_distinct's set, the map view's value counts


def _cdc_batches(sizes: list[int], seed: int) -> list[list[tuple[str, str, int]]]:
    """Valid changelog batches: -U/-D retract only what an earlier +I/+U inserted."""
    rng = random.Random(seed)
    live: dict[str, int] = {}
    out = []
    for size in sizes:
        batch: list[tuple[str, str, int]] = []
        while len(batch) < size:
            name = rng.choice(["Ann", "Bob", "Cid", "Dan", "Eve"])
            if name not in live:
                live[name] = rng.randrange(100)
                batch.append(("+I", name, live[name]))
            elif rng.random() < 0.3:
                batch.append(("-D", name, live.pop(name)))
            else:
                new = rng.randrange(100)
                batch += [("-U", name, live[name]), ("+U", name, new)]
                live[name] = new
        out.append(batch)
    return out


def _landing_batches(kind: str, sizes: list[int], seed: int) -> list[pa.Table]:
    if kind == "cdc":
        return [cdc_rows(b, start=100 * i) for i, b in enumerate(_cdc_batches(sizes, seed))]
    rows = day_events(DAY, sum(sizes), seed=seed, pages=("/a", "/b", "/c", "/d")).sort_by("event_time")
    if kind == "sessions":  # out of order: a late event extends, bridges or starts a served session
        rows = rows.take(random.Random(seed).sample(range(rows.num_rows), rows.num_rows))
    out, start = [], 0
    for size in sizes:
        out.append(rows.slice(start, size))
        start += size
    return out


def _spec(kind: str, root: Path) -> PipelineSpec:
    if kind == "cdc":
        return cdc_spec(root, udaf=True, max_files_per_batch=1)
    # lg_k 4: the sketch leaves its list and set modes after a few values, so HLL mode's union is compared too
    hll_mode = {"name": "users_k4", "fn": "approx_count_distinct", "column": "user_id", "args": {"lg_k": 4}}
    if kind == "sessions":  # about one event per user and half hour: sessions that grow, merge and split days
        return with_stream(make_spec(root, window={"gap": "30 minutes"}, group_by=["user_id"],
                                     aggregates=[*ALL_AGGREGATES, hll_mode]), max_files_per_batch=1, watermark="1 day")
    if kind in WINDOWS:  # the other fixed window kinds, without the user-defined aggregate's Arrow UDAF
        return with_stream(make_spec(root, window=WINDOWS[kind], aggregates=[*FAST_AGGREGATES, hll_mode]),
                           max_files_per_batch=1, watermark="3 hours")
    return with_stream(make_spec(root, window={"size": "1 hour"}, aggregates=[*ALL_AGGREGATES, hll_mode]),
                       max_files_per_batch=1, watermark="3 hours")


def _rows(path: str, drop: tuple[str, ...], order: list[str]) -> list[dict[str, Any]]:
    table = DeltaTable(path).to_pyarrow_table()
    table = table.drop_columns([c for c in drop if c in table.column_names])
    rows = table.to_pylist()
    return sorted(rows, key=lambda r: tuple((r[c] is None, r[c]) for c in order))


def _hll_content(data: bytes | None) -> tuple[Any, ...] | None:
    """(lg_k, mode, coupons or registers) of an HLL_8 sketch's serialisation (DataSketches' layout)."""
    if data is None:
        return None
    lg_k, mode = data[3], data[7] & 0b11
    if mode == 2:  # HLL: a 40-byte preamble, then one byte per register
        return lg_k, mode, bytes(data[40:40 + (1 << lg_k)])
    start = 8 if mode == 0 else 12  # list: coupons after the preamble; set: after a coupon count
    coupons = [int.from_bytes(data[i:i + 4], "little") for i in range(start, len(data) - 3, 4)]
    return lg_k, mode, sorted(c for c in coupons if c)


def _same_kll(a: bytes | None, b: bytes | None, where: str) -> None:
    if a is None or b is None:
        assert a == b, where
        return
    x, y = ds.kll_doubles_sketch.deserialize(a), ds.kll_doubles_sketch.deserialize(b)
    if x.is_empty() or y.is_empty():
        assert x.is_empty() and y.is_empty(), where
        return
    assert (x.n, x.get_min_value(), x.get_max_value()) == (y.n, y.get_min_value(), y.get_max_value()), where
    if x.n <= 200:  # k: nothing compacted yet, both hold every value (in an order the bytes' flags record)
        ranks = [i / x.n for i in range(x.n + 1)]
        assert x.get_quantiles(ranks) == y.get_quantiles(ranks), where
        return
    eps = 2 * x.normalized_rank_error(False)
    for q in (0.1, 0.5, 0.9):
        assert abs(x.get_rank(y.get_quantile(q)) - q) <= eps, f"{where}: q={q}"


def _assert_same(table: str, spark_rows: list[dict[str, Any]], driver_rows: list[dict[str, Any]]) -> None:
    assert len(spark_rows) == len(driver_rows), f"{table}: {len(spark_rows)} rows in Spark's, {len(driver_rows)}"
    for i, (want, got) in enumerate(zip(spark_rows, driver_rows, strict=True)):
        assert want.keys() == got.keys(), table
        kll = {c[: -len("__kll")]: c for c in want if c.endswith("__kll")}
        for column in want:
            where = f"{table} row {i} column {column}"
            if column.endswith("__hll"):
                assert _hll_content(want[column]) == _hll_content(got[column]), where
                if want[column] is not None:
                    assert ds.hll_sketch.deserialize(want[column]).get_estimate() == \
                        ds.hll_sketch.deserialize(got[column]).get_estimate(), where
            elif column.endswith("__kll"):
                _same_kll(want[column], got[column], where)
            elif column in kll and want.get(kll[column]) is not None and \
                    ds.kll_doubles_sketch.deserialize(want[kll[column]]).n > 200:  # compacted: within the rank error
                sketch = ds.kll_doubles_sketch.deserialize(want[kll[column]])
                assert abs(sketch.get_rank(got[column]) - sketch.get_rank(want[column])) <= \
                    2 * sketch.normalized_rank_error(False), where
            elif column.endswith(UNORDERED) and want[column] is not None and got[column] is not None:
                assert sorted(want[column], key=repr) == sorted(got[column], key=repr), where
            else:
                assert want[column] == got[column], f"{where}: {want[column]!r} != {got[column]!r}"


def _tables(spec: PipelineSpec) -> dict[str, list[dict[str, Any]]]:
    t, keys = PipelineTables(spec.lake, spec.name), list(spec.key_columns)
    return {"aggregates": _rows(t.aggregates, ("updated_at", "run_id"), keys),
            "changelog": _rows(t.changelog, ("run_id",), ["batch_id", "seq"]),
            "partials": _rows(t.partials, ("run_id", "created_at"), ["batch", "event_date", *keys]),
            "state": _rows(t.stream_state, (), ["event_date", *keys])}


@pytest.mark.parametrize("kind", ["windowed", "cdc", "sessions", "hopping", "cumulative"])
@settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(1, 400), min_size=2, max_size=4), combine_after=st.integers(1, 4),
       seed=st.integers(0, 10_000))
def test_both_engines_write_the_same_tables(spark, tmp_path_factory, kind, sizes, combine_after, seed):
    root = tmp_path_factory.mktemp("engines")
    if kind == "cdc":
        sizes = [max(1, s // 40) for s in sizes]  # a handful of changes per batch
    spec = _spec(kind, root)
    by_spark, by_driver = (spec.with_paths(lake=str(root / f"lake-{name}")) for name in ("spark", "driver"))
    batches = _landing_batches(kind, sizes, seed)
    on_driver = []
    for phase in (batches[:combine_after], batches[combine_after:]):
        for table in phase:
            land(root / "landing", DAY, table)
        stream.run(spark, by_spark, available_now=True, driver_max_keys=0)
        on_driver += [b.on_driver for b in stream.run(spark, by_driver, available_now=True).batches]
        if phase is not batches[combine_after:] and combine_after < len(batches):
            for run_spec in (by_spark, by_driver):  # the day's batch partials now count (the hybrid rule)
                combine.run(spark, run_spec, DAY)
    assert all(on_driver)
    want, got = _tables(by_spark), _tables(by_driver)
    for name in want:
        _assert_same(name, want[name], got[name])


def test_sessions_alone_and_merged_write_the_same_tables(spark, tmp_path, monkeypatch):
    """A session batch's partial sessions alone take the driver's column-wise path, beside ones that grow a state
    session, a key's new session apart from its open one, and sessions across midnight: Spark's tables still."""
    from spark_jobs.windows import Sessions

    served_alone: list[tuple[int, int]] = []
    alone_arrow = Sessions.alone_arrow

    def spy(self, changed, live, state, stored, keys):
        mask = alone_arrow(self, changed, live, state, stored, keys)
        served_alone.append((int(mask.sum()), int(live.sum())))
        return mask

    monkeypatch.setattr(Sessions, "alone_arrow", spy)
    spec = with_stream(make_spec(tmp_path, window={"gap": "30 minutes"}, group_by=["user_id"],
                                 aggregates=ALL_AGGREGATES), max_files_per_batch=2, watermark="1 day")
    day, next_day = dt.datetime(2024, 3, 1, tzinfo=dt.UTC), dt.datetime(2024, 3, 2, tzinfo=dt.UTC)

    def at(user: str, when: dt.datetime, ms: int) -> tuple[Any, ...]:
        return when, user, "/a", ms, 1.0, "DE"

    first = [at("a", day + dt.timedelta(hours=10), 5), at("a", day + dt.timedelta(hours=10, minutes=10), 7),
             at("b", day + dt.timedelta(hours=11), 3), at("c", day + dt.timedelta(hours=23, minutes=50), 4)]
    later = [at("a", day + dt.timedelta(hours=10, minutes=30), 9),  # grows a's open session
             at("b", day + dt.timedelta(hours=14), 1),  # a session of its own beside b's open one
             at("d", day + dt.timedelta(hours=12), 2), at("d", day + dt.timedelta(hours=12, minutes=20), 8),
             at("e", day + dt.timedelta(hours=23, minutes=55), 6)]
    after_midnight = [at("c", next_day + dt.timedelta(minutes=10), 5),  # c's session crosses midnight
                      at("e", next_day + dt.timedelta(minutes=5), 2)]
    by_spark, by_driver = (spec.with_paths(lake=str(tmp_path / f"lake-{name}")) for name in ("spark", "driver"))
    for batch in ([(DAY, first)], [(DAY, later), ("2024-03-02", after_midnight)]):
        for date, rows in batch:
            land(tmp_path / "landing", date, events(rows))
        stream.run(spark, by_spark, available_now=True, driver_max_keys=0)
        assert all(b.on_driver for b in stream.run(spark, by_driver, available_now=True).batches)
    assert any(0 < alone < live for alone, live in served_alone), served_alone  # both paths in one batch
    want, got = _tables(by_spark), _tables(by_driver)
    for name in want:
        _assert_same(name, want[name], got[name])
    sessions = {(r["user_id"], r["window_start"]): r["views"] for r in got["aggregates"]}
    assert sessions == {("a", day + dt.timedelta(hours=10)): 3, ("b", day + dt.timedelta(hours=11)): 1,
                        ("b", day + dt.timedelta(hours=14)): 1, ("c", day + dt.timedelta(hours=23, minutes=50)): 2,
                        ("d", day + dt.timedelta(hours=12)): 2, ("e", day + dt.timedelta(hours=23, minutes=55)): 2}


def test_the_driver_engine_applies_the_hybrid_rule(spark, tmp_path):
    """A day with a batch combine: the driver's aggregates count its batch partials, not the stream's."""
    spec = _spec("windowed", tmp_path)
    rows = day_events(DAY, 300, seed=7).sort_by("event_time")
    land(tmp_path / "landing", DAY, rows.slice(0, 100))
    stream.run(spark, spec, available_now=True)
    land(tmp_path / "landing", DAY, rows.slice(100, 100))
    combine.run(spark, spec, DAY)  # sees the first 200 rows
    land(tmp_path / "landing", DAY, rows.slice(200, 100))
    summary = stream.run(spark, spec, available_now=True)
    assert [b.on_driver for b in summary.batches] == [True, True]

    def window_key(r: dict[str, Any]) -> tuple[dt.datetime, str]:
        return r["event_time"].replace(minute=0, second=0, microsecond=0), r["page"]

    combined: dict[tuple[dt.datetime, str], int] = {}
    for r in rows.slice(0, 200).to_pylist():
        combined[window_key(r)] = combined.get(window_key(r), 0) + 1
    touched = {window_key(r) for r in rows.slice(100, 200).to_pylist()}
    got = {(r["window_start"], r["page"]): r["views"] for r in DeltaTable(PipelineTables(spec.lake, spec.name)
           .aggregates).to_pyarrow_table(columns=["window_start", "page", "views"]).to_pylist()}
    assert {k: got.get(k) for k in touched} == {k: combined.get(k) for k in touched}
