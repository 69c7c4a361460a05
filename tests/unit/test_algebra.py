"""The accumulator algebra of every aggregate, replayed in memory without Spark.

``AlgebraTester`` plays the role of an engine (cf. PySpark's ``TwsTester``): it folds
Python rows into accumulators with ``accumulate``/``retract``, splits a list of rows into
chunks the way batches split a group, and merges the chunks' accumulators in any order.
Each built-in is checked against an oracle computed directly in Python with SQL NULL
semantics.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.aggregates.builtins import (
    ApproxCountDistinct,
    ApproxPercentile,
    Count,
    CountDistinct,
    First,
    Last,
    Max,
    Min,
)
from spark_jobs.aggregates.contract import AggregateFunction
from spark_jobs.aggregates.examples import WeightedAvg
from spark_jobs.aggregates.registry import create
from spark_jobs.errors import RetractNotSupportedError

SCHEMA = {"v": "bigint", "x": "double", "s": "string", "t": "timestamp"}
ARROW = {"bigint": pa.int64(), "double": pa.float64(), "string": pa.string(), "timestamp": pa.timestamp("us")}

PROPERTY = settings(max_examples=60, deadline=None, database=None)
STATISTICAL = settings(max_examples=40, deadline=None, database=None, derandomize=True)

Row = tuple[Any, ...]


def make(fn: str, *columns: str, **args: Any) -> AggregateFunction[Any, Any]:
    """The aggregate object for one spec entry, as the jobs resolve it."""
    return create(fn, name=fn, columns=tuple(columns), args=args, input_type=SCHEMA.get(columns[0]) if columns else None)


# --- the harness -------------------------------------------------------------------------------


class AlgebraTester:
    """Replays the accumulator contract of one aggregate over in-memory rows.

    A row is the tuple of values ``accumulate`` takes (``()`` for ``count(*)``).
    """

    def __init__(self, function: AggregateFunction[Any, Any]) -> None:
        self.f = function

    def accumulate(self, rows: Sequence[Row], acc: Any = None) -> Any:
        acc = self.f.create_accumulator() if acc is None else acc
        for row in rows:
            acc = self.f.accumulate(acc, *row)
        return acc

    def retract(self, acc: Any, rows: Sequence[Row]) -> Any:
        for row in rows:
            acc = self.f.retract(acc, *row)
        return acc

    def accumulate_batches(self, batches: Sequence[Sequence[pa.Array]]) -> Any:
        acc = self.f.create_accumulator()
        for arrays in batches:
            acc = self.f.accumulate_batch(acc, *arrays)
        return acc

    def merge(self, accs: Sequence[Any], order: Sequence[int] | None = None) -> Any:
        """Left fold of ``merge`` starting from an empty accumulator, in ``order``."""
        acc = self.f.create_accumulator()
        for i in order if order is not None else range(len(accs)):
            acc = self.f.merge(acc, accs[i])
        return acc

    def merge_tree(self, accs: Sequence[Any], picks: Sequence[tuple[int, int]]) -> Any:
        """Merge pairs chosen by ``picks`` (indices modulo the pool) until one accumulator remains."""
        pool = list(accs) or [self.f.create_accumulator()]
        for a, b in itertools.chain(picks, itertools.repeat((0, 1))):
            if len(pool) == 1:
                break
            i = a % len(pool)
            j = b % (len(pool) - 1)
            left = pool.pop(i)
            right = pool.pop(j)
            pool.append(self.f.merge(left, right))
        return pool[0]

    def value(self, acc: Any) -> Any:
        return self.f.get_value(acc)

    def value_of(self, rows: Sequence[Row]) -> Any:
        return self.value(self.accumulate(rows))


def split(rows: Sequence[Any], cuts: Sequence[int]) -> list[list[Any]]:
    """``rows`` cut at the (unsorted, possibly repeated) positions ``cuts``; chunks may be empty."""
    bounds = [0, *sorted(min(c, len(rows)) for c in cuts), len(rows)]
    return [list(rows[a:b]) for a, b in itertools.pairwise(bounds)]


# --- oracles (SQL NULL semantics) --------------------------------------------------------------


def non_null(vals: Sequence[Any]) -> list[Any]:
    return [v for v in vals if v is not None]


def o_count_star(pairs: Sequence[tuple[Any, Any]]) -> int:
    return len(pairs)


def o_count(pairs: Sequence[tuple[Any, Any]]) -> int:
    return len(non_null([v for v, _ in pairs]))


def o_sum(pairs: Sequence[tuple[Any, Any]]) -> Any:
    vals = non_null([v for v, _ in pairs])
    return sum(vals) if vals else None


def o_avg(pairs: Sequence[tuple[Any, Any]]) -> Any:
    vals = non_null([v for v, _ in pairs])
    return sum(vals) / len(vals) if vals else None


def o_min(pairs: Sequence[tuple[Any, Any]]) -> Any:
    vals = non_null([v for v, _ in pairs])
    return min(vals) if vals else None


def o_max(pairs: Sequence[tuple[Any, Any]]) -> Any:
    vals = non_null([v for v, _ in pairs])
    return max(vals) if vals else None


def o_count_distinct(pairs: Sequence[tuple[Any, Any]]) -> int:
    return len(set(non_null([v for v, _ in pairs])))


def o_first(pairs: Sequence[tuple[Any, Any]]) -> Any:
    both = [(t, v) for v, t in pairs if v is not None and t is not None]
    return min(both)[1] if both else None


def o_last(pairs: Sequence[tuple[Any, Any]]) -> Any:
    both = [(t, v) for v, t in pairs if v is not None and t is not None]
    return max(both)[1] if both else None


# --- data ----------------------------------------------------------------------------------------

T0 = dt.datetime(2024, 3, 1)
# few distinct times so that ties in event time (broken by the value) are common
times = st.one_of(st.none(), st.integers(0, 6).map(lambda m: T0 + dt.timedelta(minutes=m)))
ints = st.one_of(st.none(), st.integers(-(10**12), 10**12))
few_ints = st.one_of(st.none(), st.integers(-5, 5))  # many duplicates, for count_distinct/min/max ties
doubles = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False))
strings = st.one_of(st.none(), st.text(alphabet="abcxyz", max_size=3))


@dataclass(frozen=True)
class Case:
    """One built-in bound to a column, the data it is fed and its oracle."""

    id: str
    fn: str
    column: str | None  # None: count(*)
    values: st.SearchStrategy[Any]
    oracle: Callable[[Sequence[tuple[Any, Any]]], Any]
    approx: bool = False

    def function(self) -> AggregateFunction[Any, Any]:
        return make(self.fn, *([self.column] if self.column else []))

    @property
    def pairs(self) -> st.SearchStrategy[list[tuple[Any, Any]]]:
        """Lists of (value, event time) input rows."""
        return st.lists(st.tuples(self.values, times), max_size=60)

    def rows(self, pairs: Sequence[tuple[Any, Any]]) -> list[Row]:
        """The arguments ``accumulate`` takes for each input row."""
        if self.column is None:
            return [() for _ in pairs]
        if self.fn in ("first", "last"):
            return [(v, t) for v, t in pairs]
        return [(v,) for v, _ in pairs]

    def arrays(self, pairs: Sequence[tuple[Any, Any]]) -> list[pa.Array]:
        """The Arrow batch ``accumulate_batch`` takes (``count(*)`` gets any column, for the row count)."""
        value_type = ARROW[SCHEMA[self.column or "v"]]
        values = pa.array([v for v, _ in pairs], value_type)
        if self.fn in ("first", "last"):
            return [values, pa.array([t for _, t in pairs], ARROW["timestamp"])]
        return [values]

    def check(self, actual: Any, expected: Any) -> None:
        if self.approx and expected is not None:
            assert actual == pytest.approx(expected, rel=1e-9, abs=1e-6)
        else:
            assert actual == expected
            assert type(actual) is type(expected)


CASES = [
    Case("count_star", "count", None, ints, o_count_star),
    Case("count_bigint", "count", "v", ints, o_count),
    Case("count_string", "count", "s", strings, o_count),
    Case("sum_bigint", "sum", "v", ints, o_sum),
    Case("sum_double", "sum", "x", doubles, o_sum, approx=True),
    Case("avg_bigint", "avg", "v", ints, o_avg),
    Case("avg_double", "avg", "x", doubles, o_avg, approx=True),
    Case("min_bigint", "min", "v", few_ints, o_min),
    Case("max_bigint", "max", "v", few_ints, o_max),
    Case("min_string", "min", "s", strings, o_min),
    Case("max_double", "max", "x", doubles, o_max),
    Case("count_distinct_bigint", "count_distinct", "v", few_ints, o_count_distinct),
    Case("count_distinct_string", "count_distinct", "s", strings, o_count_distinct),
    Case("first_bigint", "first", "v", few_ints, o_first),
    Case("last_bigint", "last", "v", few_ints, o_last),
    Case("first_string", "first", "s", strings, o_first),
    Case("last_string", "last", "s", strings, o_last),
]
CASE_PARAMS = [pytest.param(c, id=c.id) for c in CASES]
RETRACTABLE = [pytest.param(c, id=c.id) for c in CASES if c.function().supports_retract]


def test_retract_capable_builtins_are_exactly_count_sum_avg() -> None:
    assert sorted({c.fn for c in CASES if c.function().supports_retract}) == ["avg", "count", "sum"]


# (a) accumulate-all equals the oracle ------------------------------------------------------------


@pytest.mark.parametrize("case", CASE_PARAMS)
@PROPERTY
@given(data=st.data())
def test_accumulate_matches_oracle(case: Case, data: st.DataObject) -> None:
    pairs = data.draw(case.pairs, label="rows")
    h = AlgebraTester(case.function())
    case.check(h.value_of(case.rows(pairs)), case.oracle(pairs))


@pytest.mark.parametrize(
    ("fn", "column", "empty"),
    [("count", None, 0), ("count", "v", 0), ("sum", "v", None), ("avg", "v", None), ("min", "v", None),
     ("max", "s", None), ("count_distinct", "v", 0), ("first", "v", None), ("last", "v", None),
     ("approx_count_distinct", "v", 0)],
)
def test_aggregate_of_no_rows(fn: str, column: str | None, empty: Any) -> None:
    f = make(fn, *([column] if column else []))
    assert f.get_value(f.create_accumulator()) == empty


def test_aggregate_of_only_nulls_is_null_except_counts() -> None:
    rows = [(None,)] * 3
    assert AlgebraTester(make("count", "v")).value_of(rows) == 0
    assert AlgebraTester(make("count")).value_of([()] * 3) == 3
    for fn in ("sum", "avg", "min", "max"):
        assert AlgebraTester(make(fn, "v")).value_of(rows) is None, fn
    assert AlgebraTester(make("count_distinct", "v")).value_of(rows) == 0
    assert AlgebraTester(make("first", "v")).value_of([(None, T0), (1, None)]) is None


# (b) merge of chunks, in any order and any tree shape, equals accumulate-all ---------------------


@pytest.mark.parametrize("case", CASE_PARAMS)
@PROPERTY
@given(data=st.data())
def test_merge_of_chunks_in_any_order(case: Case, data: st.DataObject) -> None:
    pairs = data.draw(case.pairs, label="rows")
    cuts = data.draw(st.lists(st.integers(0, len(pairs)), max_size=5), label="cuts")
    chunks = split(pairs, cuts)
    order = data.draw(st.permutations(range(len(chunks))), label="order")
    h = AlgebraTester(case.function())
    expected = case.oracle(pairs)

    accs = [h.accumulate(case.rows(c)) for c in chunks]
    case.check(h.value(h.merge(accs, order)), expected)

    picks = data.draw(st.lists(st.tuples(st.integers(0, 10), st.integers(0, 10)), max_size=6), label="tree")
    accs = [h.accumulate(case.rows(c)) for c in chunks]  # fresh: merge may reuse its argument
    case.check(h.value(h.merge_tree(accs, picks)), expected)


# (c) accumulate_batch over Arrow equals the loop of accumulate -----------------------------------


@pytest.mark.parametrize("case", CASE_PARAMS)
@PROPERTY
@given(data=st.data())
def test_accumulate_batch_matches_loop(case: Case, data: st.DataObject) -> None:
    pairs = data.draw(case.pairs, label="rows")
    cuts = data.draw(st.lists(st.integers(0, len(pairs)), max_size=3), label="cuts")
    h = AlgebraTester(case.function())
    loop = h.value_of(case.rows(pairs))
    case.check(h.value(h.accumulate_batches([case.arrays(pairs)])), loop)
    # several batches folded into one accumulator, some of them empty
    case.check(h.value(h.accumulate_batches([case.arrays(c) for c in split(pairs, cuts)])), loop)


def test_count_star_batch_needs_a_column_for_the_row_count() -> None:
    f = make("count")
    with pytest.raises(ValueError, match=r"count\(\*\) over arrays needs the row count"):
        f.accumulate_batch(0)
    # the column's NULLs still count as rows for count(*)
    assert f.accumulate_batch(0, pa.array([1, None, None])) == 3
    assert make("count", "v").accumulate_batch(0, pa.array([1, None, None])) == 1


# (d) retract a subset equals accumulating the rest ------------------------------------------------


@pytest.mark.parametrize("case", RETRACTABLE)
@PROPERTY
@given(data=st.data())
def test_retract_subset_equals_accumulating_the_rest(case: Case, data: st.DataObject) -> None:
    pairs = data.draw(case.pairs, label="rows")
    drop = data.draw(st.lists(st.booleans(), min_size=len(pairs), max_size=len(pairs)), label="retracted")
    kept = [p for p, d in zip(pairs, drop, strict=True) if not d]
    gone = [p for p, d in zip(pairs, drop, strict=True) if d]
    h = AlgebraTester(case.function())
    acc = h.retract(h.accumulate(case.rows(pairs)), case.rows(gone))
    case.check(h.value(acc), case.oracle(kept))


@pytest.mark.parametrize("case", RETRACTABLE)
def test_retract_everything_gives_the_empty_value(case: Case) -> None:
    pairs = [(3, T0), (None, T0), (4, None)] if case.column != "x" else [(3.5, T0), (None, T0), (-1.5, None)]
    h = AlgebraTester(case.function())
    acc = h.retract(h.accumulate(case.rows(pairs)), case.rows(pairs))
    assert h.value(acc) == case.oracle([])


# (e) aggregates without retract say so --------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "function", "row"),
    [
        pytest.param(Min, make("min", "v"), (1,), id="Min"),
        pytest.param(Max, make("max", "v"), (1,), id="Max"),
        pytest.param(CountDistinct, make("count_distinct", "v"), (1,), id="CountDistinct"),
        pytest.param(ApproxCountDistinct, make("approx_count_distinct", "v"), (1,), id="ApproxCountDistinct"),
        pytest.param(ApproxPercentile, make("approx_percentile", "v", q=0.5), (1,), id="ApproxPercentile"),
        pytest.param(First, make("first", "v"), (1, T0), id="First"),
        pytest.param(Last, make("last", "v"), (1, T0), id="Last"),
    ],
)
def test_retract_not_supported(cls: type, function: AggregateFunction[Any, Any], row: Row) -> None:
    assert isinstance(function, cls)
    assert not function.supports_retract
    acc = function.accumulate(function.create_accumulator(), *row)
    with pytest.raises(RetractNotSupportedError, match=rf"^{cls.__name__} cannot retract; .*-U/-D"):
        function.retract(acc, *row)
    assert issubclass(RetractNotSupportedError, NotImplementedError)


def test_count_accumulator_is_a_plain_number() -> None:
    assert isinstance(make("count"), Count)
    h = AlgebraTester(make("count", "v"))
    assert h.accumulate([(1,), (None,), (2,)]) == 2


# --- approx_count_distinct -------------------------------------------------------------------------


def hll_bound(lg_k: int) -> float:
    return 3 * 1.04 / math.sqrt(2**lg_k)


@st.composite
def distinct_values(draw: st.DrawFn) -> tuple[list[Any], int]:
    """(values with repeats and NULLs, exact distinct count); up to 20k distinct ints or strings."""
    n = draw(st.integers(0, 20_000), label="distinct")
    offset = draw(st.integers(0, 2**40), label="offset")
    distinct: list[Any] = list(range(offset, offset + n))
    if draw(st.booleans(), label="as strings"):
        distinct = [f"user-{v}" for v in distinct]
    repeats = draw(st.integers(0, min(n, 500)), label="repeats")
    values: list[Any] = distinct + distinct[:repeats] + [None] * draw(st.integers(0, 20), label="nulls")
    np.random.default_rng(n).shuffle(values)
    return values, n


@STATISTICAL
@given(sample=distinct_values(), lg_k=st.sampled_from([10, 12, 14]), data=st.data())
def test_approx_count_distinct_error_bound(sample: tuple[list[Any], int], lg_k: int, data: st.DataObject) -> None:
    values, exact = sample
    h = AlgebraTester(make("approx_count_distinct", "v", lg_k=lg_k))
    rows = [(v,) for v in values]
    bound = hll_bound(lg_k)
    single = h.value_of(rows)
    assert isinstance(single, int)
    assert abs(single - exact) <= bound * exact, (single, exact)

    cuts = data.draw(st.lists(st.integers(0, len(rows)), max_size=4), label="cuts")
    chunks = split(rows, cuts)
    order = data.draw(st.permutations(range(len(chunks))), label="order")
    merged = h.value(h.merge([h.accumulate(c) for c in chunks], order))
    assert abs(merged - exact) <= bound * exact, (merged, exact)


def test_approx_count_distinct_is_exact_for_few_values() -> None:
    h = AlgebraTester(make("approx_count_distinct", "s"))
    rows = [(v,) for v in ["a", "b", None, "a", "c"]]
    assert h.value_of(rows) == 3
    assert h.value(h.merge([h.accumulate(rows[:2]), h.accumulate(rows[2:])])) == 3


def test_approx_count_distinct_accumulate_batch_matches_loop() -> None:
    h = AlgebraTester(make("approx_count_distinct", "v"))
    values = [*range(5000), None, *range(2500)]
    assert h.value(h.accumulate_batches([[pa.array(values, pa.int64())]])) == h.value_of([(v,) for v in values])


def _hll_chunks(n: int, sizes: Sequence[int]) -> tuple[AlgebraTester, list[list[Row]]]:
    rows = [(v,) for v in np.random.default_rng(1).permutation(n).tolist()]
    bounds = np.cumsum([0, *sizes])
    assert bounds[-1] == n
    return AlgebraTester(make("approx_count_distinct", "v")), [rows[a:b] for a, b in itertools.pairwise(bounds)]


# DataSketches HLL: a union's estimate can depend on merge order and differ from one sketch's (the
# HIP vs composite estimators); the documented contract is the error bound, asserted here.
HLL_BOUND = 3 * 1.04 / math.sqrt(2**12)


def test_approx_count_distinct_merge_order_stays_within_the_error_bound() -> None:
    h, chunks = _hll_chunks(1000, [216, 185, 508, 91])
    for order in itertools.permutations(range(4)):
        estimate = h.value(h.merge([h.accumulate(c) for c in chunks], order))
        assert abs(estimate - 1000) <= HLL_BOUND * 1000, (order, estimate)


def test_approx_count_distinct_merged_chunks_stay_within_the_error_bound() -> None:
    h, chunks = _hll_chunks(20_000, [5000, 5000, 5000, 5000])
    single = h.value_of([r for c in chunks for r in c])
    merged = h.value(h.merge([h.accumulate(c) for c in chunks]))
    assert abs(merged - 20_000) <= HLL_BOUND * 20_000
    assert abs(single - 20_000) <= HLL_BOUND * 20_000


# --- approx_percentile --------------------------------------------------------------------------


def assert_rank_near(values: Sequence[Any], result: Any, q: float, tol: float = 0.02) -> None:
    """``result`` is an input value whose normalised rank interval is within ``tol`` of ``q``."""
    data = np.sort(np.array(non_null(values), dtype=float))
    assert float(result) in set(data.tolist())
    lo = np.searchsorted(data, float(result), "left") / len(data)
    hi = np.searchsorted(data, float(result), "right") / len(data)
    assert lo - tol <= q <= hi + tol, (result, q, lo, hi)


percentile_values = st.one_of(
    st.lists(st.one_of(st.none(), st.integers(-1000, 10**6)), min_size=1, max_size=400),
    st.builds(
        lambda n, seed, nulls: [*np.random.default_rng(seed).lognormal(7.0, 1.0, n).astype(np.int64).tolist(),
                                *[None] * nulls],
        st.integers(1, 20_000), st.integers(0, 2**32), st.integers(0, 10)),
)


@STATISTICAL
@given(values=percentile_values, q=st.sampled_from([0.5, 0.95]), data=st.data())
def test_approx_percentile_rank_error(values: list[Any], q: float, data: st.DataObject) -> None:
    h = AlgebraTester(make("approx_percentile", "v", q=q))
    rows = [(v,) for v in values]
    if not non_null(values):
        assert h.value_of(rows) is None
        return
    single = h.value_of(rows)
    assert isinstance(single, int)  # cast back to the bigint column's type
    assert_rank_near(values, single, q)

    cuts = data.draw(st.lists(st.integers(0, len(rows)), max_size=4), label="cuts")
    chunks = split(rows, cuts)
    order = data.draw(st.permutations(range(len(chunks))), label="order")
    merged = h.value(h.merge([h.accumulate(c) for c in chunks], order))
    assert_rank_near(values, merged, q)


@pytest.mark.parametrize(("q", "expected"), [(0.0, {1}), (0.5, {50, 51}), (0.95, {95, 96}), (1.0, {100})])
def test_approx_percentile_is_exact_below_k(q: float, expected: set[int]) -> None:
    # below k items the sketch keeps every value: the answer is the lower or upper q-quantile
    # (which one depends on the sketch's inclusive/exclusive rank convention)
    h = AlgebraTester(make("approx_percentile", "v", q=q))
    assert h.value_of([(v,) for v in [*range(100, 0, -1), None]]) in expected


def test_approx_percentile_of_a_double_column_is_a_double() -> None:
    h = AlgebraTester(make("approx_percentile", "x", q=0.5))
    assert h.value_of([(0.5,), (1.5,), (2.5,)]) == 1.5
    assert h.value_of([]) is None


def test_approx_percentile_accumulate_batch_matches_loop() -> None:
    h = AlgebraTester(make("approx_percentile", "v", q=0.5))
    values = [5, 1, None, 3, 2, 4]
    assert h.value(h.accumulate_batches([[pa.array(values, pa.int64())]])) == h.value_of([(v,) for v in values])


def test_approx_percentile_accumulate_batch_of_only_nulls() -> None:
    h = AlgebraTester(make("approx_percentile", "v", q=0.5))
    assert h.value(h.accumulate_batches([[pa.array([None, None], pa.int64())], [pa.array([], pa.int64())]])) is None


# --- sum overflow ---------------------------------------------------------------------------------


def test_sum_accumulate_batch_does_not_wrap_on_overflow() -> None:
    h = AlgebraTester(make("sum", "v"))
    values = [2**62, 2**62]
    assert h.value(h.accumulate_batches([[pa.array(values, pa.int64())]])) == h.value_of([(v,) for v in values])


# --- WeightedAvg (the user-defined example) --------------------------------------------------------

# integers times multiples of 1/8: every product and sum is exact in float64
exact_values = st.one_of(st.none(), st.integers(-(10**6), 10**6))
exact_weights = st.one_of(st.none(), st.integers(1, 32).map(lambda k: k / 8))
float_values = st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False))
float_weights = st.one_of(st.none(), st.floats(0.5, 2.0))
weighted_rows = st.one_of(
    st.lists(st.tuples(exact_values, exact_weights), max_size=60),
    st.lists(st.tuples(float_values, float_weights), max_size=60),
)


def weighted_oracle(rows: Sequence[tuple[Any, Any]]) -> float | None:
    both = [(v, w) for v, w in rows if v is not None and w is not None]
    if not both:
        return None
    v, w = np.array(both, dtype=float).T
    return float(np.sum(v * w) / np.sum(w))


def weighted_arrays(rows: Sequence[tuple[Any, Any]]) -> list[pa.Array]:
    value_type = pa.int64() if all(isinstance(v, int) or v is None for v, _ in rows) else pa.float64()
    return [pa.array([v for v, _ in rows], value_type), pa.array([w for _, w in rows], pa.float64())]


def assert_close(actual: float | None, expected: float | None) -> None:
    if expected is None:
        assert actual is None
    else:
        assert actual == pytest.approx(expected, rel=1e-9)


def test_weighted_avg_is_resolvable_from_a_spec() -> None:
    f = create("spark_jobs.aggregates.examples:WeightedAvg", name="w", columns=("v", "x"))
    assert isinstance(f, WeightedAvg)
    assert f.supports_retract
    assert f.num_inputs == 2


@PROPERTY
@given(rows=weighted_rows, data=st.data())
def test_weighted_avg_batch_loop_and_oracle_agree(rows: list[tuple[Any, Any]], data: st.DataObject) -> None:
    h = AlgebraTester(WeightedAvg())
    expected = weighted_oracle(rows)
    assert_close(h.value_of(rows), expected)
    assert_close(h.value(h.accumulate_batches([weighted_arrays(rows)])), expected)
    cuts = data.draw(st.lists(st.integers(0, len(rows)), max_size=3), label="cuts")
    batches = [weighted_arrays(c) for c in split(rows, cuts)]
    assert_close(h.value(h.accumulate_batches(batches)), expected)


@PROPERTY
@given(rows=weighted_rows, data=st.data())
def test_weighted_avg_merge_and_merge_batch(rows: list[tuple[Any, Any]], data: st.DataObject) -> None:
    f = WeightedAvg()
    h = AlgebraTester(f)
    expected = weighted_oracle(rows)
    chunks = split(rows, data.draw(st.lists(st.integers(0, len(rows)), max_size=5), label="cuts"))
    order = data.draw(st.permutations(range(len(chunks))), label="order")
    accs = [h.accumulate(c) for c in chunks]
    assert_close(h.value(h.merge(accs, order)), expected)
    assert_close(h.value(f.merge_batch(f.create_accumulator(), [accs[i] for i in order])), expected)
    # merge_batch receives the accumulators as Arrow hands them back: dicts of the struct type
    stored = pa.array(accs, type=WeightedAvg.accumulator_type).to_pylist()
    assert_close(h.value(f.merge_batch(f.create_accumulator(), stored)), expected)


@PROPERTY
@given(rows=st.lists(st.tuples(exact_values, exact_weights), max_size=60), data=st.data())
def test_weighted_avg_retract(rows: list[tuple[Any, Any]], data: st.DataObject) -> None:
    drop = data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)), label="retracted")
    kept = [r for r, d in zip(rows, drop, strict=True) if not d]
    gone = [r for r, d in zip(rows, drop, strict=True) if d]
    h = AlgebraTester(WeightedAvg())
    assert_close(h.value(h.retract(h.accumulate(rows), gone)), weighted_oracle(kept))


def test_weighted_avg_ignores_rows_with_a_null() -> None:
    h = AlgebraTester(WeightedAvg())
    assert h.value_of([(10, 1.0), (None, 5.0), (1000, None), (20, 3.0)]) == pytest.approx(17.5, rel=1e-9)
    assert h.value_of([(None, 1.0), (1, None)]) is None
    assert h.value_of([]) is None
