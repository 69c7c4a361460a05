"""The column-wise merges of HLL, KLL, first/last and the example ``WeightedAvg`` equal ``decode`` + ``merge_all`` per group,
and the column-wise values of stored accumulators equal ``decode`` + ``get_value`` per row.

Stored columns are synthetic (random sketch sizes, modes, NULLs, serialisations, group sizes), so every
path the fast merges take, and every input they hand back to the per-group fold, is exercised.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
from typing import Any

import datasketches as ds
import numpy as np
import pyarrow as pa
import pytest

from spark_jobs.aggregates.builtins import ApproxCountDistinct, ApproxPercentile, Avg, Count, First, Last, Max, Min, Sum
from spark_jobs.aggregates.contract import BoundAggregate
from spark_jobs.aggregates.examples import WeightedAvg
from spark_jobs.phases.arrow_merge import merge_groups

T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def groups_of(rng: random.Random, n: int) -> np.ndarray:
    sizes: list[int] = []
    while sum(sizes) < n:
        sizes.append(min(rng.choice([1, 1, 2, 3, 5, 20, 60]), n - sum(sizes)))
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def folded(fn: Any, column: pa.Array, offsets: np.ndarray) -> list[Any]:
    decoded = [fn.decode([c]) for c in column.to_pylist()]
    return [fn.merge_all(decoded[lo:hi]) for lo, hi in itertools.pairwise(offsets)]


@pytest.mark.parametrize("seed", range(6))
def test_hll_unions_are_byte_identical(seed):
    rng = random.Random(seed)
    fn = ApproxCountDistinct("u", ["x"], {"lg_k": rng.choice([4, 8, 12])})
    cells: list[bytes | None] = []
    for _ in range(200):
        if rng.random() < 0.05:
            cells.append(None)
            continue
        sketch = ds.hll_sketch(rng.choice([fn.lg_k, fn.lg_k, 5, 14]), ds.tgt_hll_type.HLL_8)  # some other lg_k
        for _ in range(rng.choice([0, 1, 5, 50, 500, 3000])):
            sketch.update(rng.randrange(100_000))
        cells.append(sketch.serialize_updatable() if rng.random() < 0.8 else sketch.serialize_compact())
    column = pa.array(cells, pa.binary())
    offsets = groups_of(rng, len(cells))
    fast, slow = fn.merge_groups([column], offsets), folded(fn, column, offsets)
    assert fast is not None
    assert [s.serialize_updatable() for s in fast] == [s.serialize_updatable() for s in slow]


@pytest.mark.parametrize("seed", range(6))
def test_kll_merges_keep_every_item_and_bound(seed):
    rng = random.Random(seed)
    k = rng.choice([8, 50, 200])
    fn = ApproxPercentile("p", ["x"], {"q": 0.5, "k": k})
    big = seed % 2 == 0
    cells: list[bytes | None] = []
    for _ in range(150):
        if rng.random() < 0.05:
            cells.append(None)
            continue
        sketch = ds.kll_doubles_sketch(rng.choice([k, k, 8, 400]) if big else 400)
        for _ in range(rng.choice([0, 1, 1, 2, 3, 10, 30] + ([300, 2000] if big else []))):
            sketch.update(rng.random() * 100)
        if sketch.n and rng.random() < 0.2:
            sketch.get_quantile(0.5, True)  # sorts level 0 in place and flags it so: still level 0 only
        cells.append(sketch.serialize())
    column = pa.array(cells, pa.binary())
    offsets = groups_of(rng, len(cells))
    fast, slow = fn.merge_groups([column], offsets), folded(fn, column, offsets)
    assert fast is not None
    for x, y in zip(fast, slow, strict=True):
        assert (x.n, x.num_retained, x.k, x.is_empty()) == (y.n, y.num_retained, y.k, y.is_empty())
        if not x.is_empty():
            assert (x.get_min_value(), x.get_max_value()) == (y.get_min_value(), y.get_max_value())
        if not x.is_estimation_mode():  # nothing compacted: the same items, so the same bytes
            assert x.serialize() == y.serialize()


VALUE_TYPES = [pa.string(), pa.int64(), pa.int32(), pa.timestamp("us", tz="UTC"), pa.binary(), pa.bool_(),
               pa.float64()]


@pytest.mark.parametrize("value_type", VALUE_TYPES, ids=str)
@pytest.mark.parametrize("cls", [First, Last])
def test_first_and_last_pick_what_the_fold_picks(cls, value_type):
    rng = random.Random(str(value_type))

    def value() -> Any:
        if value_type == pa.string():
            return rng.choice(["a", "b", "é", "z", "ab", ""])
        if value_type == pa.binary():
            return rng.choice([b"a", b"\xff", b"", b"ab"])
        if value_type == pa.bool_():
            return rng.random() < 0.5
        if pa.types.is_timestamp(value_type):
            return T0 + dt.timedelta(seconds=rng.randrange(5))
        if value_type == pa.float64():
            return rng.choice([1.5, -2.0, 0.0])
        return rng.randrange(-3, 3)

    fn = cls("f", ["x", "t"])
    for n in (0, 1, 50, 300):  # ties in time are frequent: four distinct minutes
        cells = [None if rng.random() < 0.2 else {"at": T0 + dt.timedelta(minutes=rng.randrange(4)), "value": value()}
                 for _ in range(n)]
        column = pa.array(cells, pa.struct([("at", pa.timestamp("us", tz="UTC")), ("value", value_type)]))
        offsets = groups_of(rng, n) if n else np.zeros(1, np.int64)
        fast = fn.merge_groups([column], offsets)
        assert fast is None or fast == folded(fn, column, offsets)
        if value_type != pa.float64():  # floats sort differently in Arrow (NaN, -0.0): the fold takes them
            assert fast is not None
            (stored,) = fn.merge_groups_stored([column], offsets)  # the same accumulators, never Python objects
            assert stored.type == column.type
            assert [fn.decode([c]) for c in stored.to_pylist()] == fast
            assert fn.stored_values([stored]).to_pylist() == [fn.get_value(a) for a in fast]


def test_nanosecond_times_are_left_to_the_fold():
    column = pa.array([{"at": 1, "value": 2}], pa.struct([("at", pa.timestamp("ns")), ("value", pa.int64())]))
    assert First("f", ["x", "t"]).merge_groups([column], np.array([0, 1])) is None


@pytest.mark.parametrize("seed", range(3))
def test_weighted_avg_sums_what_the_fold_sums(seed):
    rng = random.Random(seed)
    fn = WeightedAvg()
    for n in (0, 1, 40, 300):
        cells = [None if rng.random() < 0.2 else {"weighted_sum": rng.uniform(-50, 50), "weight": rng.uniform(0, 5)}
                 for _ in range(n)]
        column = pa.array(cells, fn.accumulator_type)
        offsets = groups_of(rng, n) if n else np.zeros(1, np.int64)
        (stored,) = fn.merge_groups_stored([column], offsets)
        assert stored.type == column.type and len(stored) == len(offsets) - 1
        for got, want in zip(stored.to_pylist(), folded(fn, column, offsets), strict=True):
            assert got == pytest.approx(want, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cls", [Count, Sum, Avg, Min, Max])
@pytest.mark.parametrize("input_type", ["bigint", "double"])
def test_stored_values_are_the_values_of_the_decoded_accumulators(cls, input_type, seed):
    """NULL cells, zero and negative counts (a changelog source's retractions) included."""
    rng = random.Random(seed)
    fn = cls("f", ["x"], {}, input_type)
    types = fn.acc_types()
    number = (lambda: rng.randrange(-50, 50)) if pa.types.is_integer(types[0]) else (lambda: rng.uniform(-50, 50))

    def cell() -> list[Any]:  # (value or sum, count): a sum is NULL only where nothing was counted
        count = rng.randrange(-2, 4)
        return [None if count == 0 and rng.random() < 0.5 else number(), count][:len(types)]

    cells = [[None] * len(types) if rng.random() < 0.2 else cell() for _ in range(rng.randrange(0, 40))]
    columns = [pa.array([row[j] for row in cells], t) for j, t in enumerate(types)]
    want = [fn.get_value(fn.decode(list(row))) for row in zip(*(c.to_pylist() for c in columns), strict=True)]
    assert fn.stored_values(columns).cast(fn.value_type()).to_pylist() == want


def test_groups_in_a_given_order_keep_their_accumulators():
    rng = random.Random(7)
    hll, total = ApproxCountDistinct("u", ["x"], {}), Sum("t", ["x"])
    entries = [BoundAggregate("u", ("x",), hll), BoundAggregate("t", ("x",), total)]
    keys = [rng.randrange(40) for _ in range(300)]
    sketches = []
    for k in keys:
        sketch = hll.create_accumulator()
        for v in range(k, k + rng.randrange(1, 30)):
            sketch.update(v)
        sketches.append(sketch.serialize_updatable())
    rows = pa.table({"k": keys, "day": [k % 3 for k in keys], "n_rows": [1] * len(keys), "u__hll": sketches,
                     "t__sum": [float(k) for k in keys], "t__count": [1] * len(keys)})
    plain, plain_accs = merge_groups(rows, ["k", "day"], entries)
    ordered, accs = merge_groups(rows, ["k", "day"], entries, order=["day", "k"])
    assert ordered.select(["day", "k"]).to_pylist() == sorted(plain.select(["day", "k"]).to_pylist(),
                                                              key=lambda r: (r["day"], r["k"]))
    def by_key(table: pa.Table, sketches: Any) -> dict[int, tuple[float, bytes]]:
        return {k: (t, s.serialize_updatable()) for k, t, s in zip(table.column("k").to_pylist(),
                                                                   table.column("t__sum").to_pylist(), sketches,
                                                                   strict=True)}
    assert by_key(ordered, accs["u"]) == by_key(plain, plain_accs["u"])
