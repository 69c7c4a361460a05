"""The pure Arrow helpers behind the user-defined aggregate path: grouping and buffering."""

from __future__ import annotations

import datetime as dt
import itertools
from collections import defaultdict
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.aggregates.vectorized import _buffered, _grouped, _key_array, _plain

SETTINGS = settings(max_examples=80, deadline=None, database=None)
UTC = dt.UTC

KEY_TYPES = {"page": pa.string(), "n": pa.int64(), "at": pa.timestamp("us", tz="UTC"), "flag": pa.bool_()}
KEY_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "page": st.sampled_from(["/a", "/b", "/c", ""]),
    "n": st.integers(-3, 3),
    "at": st.sampled_from([
        dt.datetime(2024, 3, 1, tzinfo=UTC),
        dt.datetime(2024, 3, 1, 1, tzinfo=UTC),
        dt.datetime(1970, 1, 1, tzinfo=UTC),
        dt.datetime(9999, 12, 31, 23, tzinfo=UTC),  # beyond pandas' nanosecond range
    ]),
    "flag": st.booleans(),
}


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    """Random tables of key columns (with NULLs) plus a ``row`` id column, possibly in several chunks."""
    n = draw(st.integers(0, 40), label="rows")
    columns = {
        name: pa.array(draw(st.lists(st.one_of(st.none(), values), min_size=n, max_size=n)), KEY_TYPES[name])
        for name, values in KEY_VALUES.items()
    }
    table = pa.table({**columns, "row": pa.array(range(n), pa.int64())})
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=3), label="chunks"))
    bounds = [0, *cuts, n]
    batches = [b for a, z in itertools.pairwise(bounds) for b in table.slice(a, z - a).to_batches()]
    return pa.Table.from_batches(batches, schema=table.schema)


key_lists = st.lists(st.sampled_from(list(KEY_TYPES)), unique=True, max_size=4)


def python_groups(table: pa.Table, keys: list[str]) -> dict[tuple[Any, ...], list[int]]:
    """Oracle: row ids per key tuple, grouped in plain Python (NULL is a key value of its own).

    Keys are in the engine's plain form: temporal values as their integer representation."""
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    cols = [_plain(table.column(k)) for k in keys]
    for i, row in enumerate(table.column("row").to_pylist()):
        groups[tuple(c[i] for c in cols)].append(row)
    return dict(groups)


def check_grouped(table: pa.Table, keys: list[str]) -> tuple[pa.Table, list[tuple[Any, ...]], list[int]]:
    out, group_keys, offsets_arr = _grouped(table, keys)
    offsets = [int(o) for o in offsets_arr]

    # same rows, same schema
    assert out.schema == table.schema
    assert out.num_rows == table.num_rows
    assert sorted(out.column("row").to_pylist()) == list(range(table.num_rows))

    # offsets cut the table into len(group_keys) non-empty slices
    assert len(offsets) == len(group_keys) + 1
    assert offsets[0] == 0
    assert offsets[-1] == table.num_rows
    if table.num_rows:
        assert all(a < b for a, b in itertools.pairwise(offsets))

    # each slice holds exactly one key's rows, all of them, in their input order
    expected = python_groups(table, keys) if table.num_rows else {}
    assert len(group_keys) == len(set(group_keys))
    got: dict[tuple[Any, ...], list[int]] = {}
    for g, key in enumerate(group_keys):
        part = out.slice(offsets[g], offsets[g + 1] - offsets[g])
        for k, value in zip(keys, key, strict=True):
            assert _plain(part.column(k)) == [value] * part.num_rows, (k, value)
        got[key] = part.column("row").to_pylist()
    if table.num_rows:
        assert got == expected
    return out, group_keys, offsets


@SETTINGS
@given(table=tables(), keys=key_lists)
def test_grouped_slices_hold_one_key_each(table: pa.Table, keys: list[str]) -> None:
    check_grouped(table, keys)


@SETTINGS
@given(table=tables(), keys=key_lists.filter(bool))
def test_grouped_sizes_match_pandas_groupby(table: pa.Table, keys: list[str]) -> None:
    _, group_keys, offsets = check_grouped(table, keys)
    sizes = {key: offsets[g + 1] - offsets[g] for g, key in enumerate(group_keys)}
    frame = table.to_pandas(coerce_temporal_nanoseconds=False)
    expected = frame.groupby(keys, dropna=False, sort=False).size()
    assert sorted(sizes.values()) == sorted(int(s) for s in expected.to_numpy())
    assert len(sizes) == len(expected)


def test_grouped_without_keys_is_one_group_of_all_rows() -> None:
    table = pa.table({"page": ["/b", None, "/a"], "row": [0, 1, 2]})
    out, group_keys, offsets = _grouped(table, [])
    assert out.equals(table)
    assert group_keys == [()]
    assert list(offsets) == [0, 3]


def test_grouped_without_keys_on_an_empty_table() -> None:
    table = pa.table({"row": pa.array([], pa.int64())})
    out, group_keys, offsets = _grouped(table, [])
    assert out.num_rows == 0
    assert group_keys == [()]
    assert list(offsets) == [0, 0]


def test_grouped_with_keys_on_an_empty_table() -> None:
    table = pa.table({"page": pa.array([], pa.string()), "row": pa.array([], pa.int64())})
    out, group_keys, offsets = _grouped(table, ["page"])
    assert out.num_rows == 0
    assert group_keys == []
    assert list(offsets) == [0]


def test_grouped_null_is_a_key_of_its_own() -> None:
    table = pa.table({"page": ["/a", None, "/a", None, "/b"], "row": [0, 1, 2, 3, 4]})
    _, group_keys, _ = check_grouped(table, ["page"])
    assert sorted(group_keys, key=repr) == sorted([("/a",), (None,), ("/b",)], key=repr)


def test_grouped_timestamp_keys_keep_their_type_and_value() -> None:
    at = [dt.datetime(2024, 3, 1, h, tzinfo=UTC) for h in (1, 0, 1, 0)]
    table = pa.table({"at": pa.array(at, pa.timestamp("us", tz="UTC")), "row": [0, 1, 2, 3]})
    out, group_keys, _ = check_grouped(table, ["at"])
    assert out.schema.field("at").type == pa.timestamp("us", tz="UTC")
    keys = _key_array([k[0] for k in group_keys], pa.timestamp("us", tz="UTC")).to_pylist()
    assert set(keys) == {dt.datetime(2024, 3, 1, 0, tzinfo=UTC), dt.datetime(2024, 3, 1, 1, tzinfo=UTC)}


def test_grouped_large_bigint_keys_with_a_null() -> None:
    table = pa.table({"n": pa.array([2**53, 2**53 + 1, None], pa.int64()), "row": [0, 1, 2]})
    check_grouped(table, ["n"])


def test_grouped_nan_and_null_double_keys_are_different_groups() -> None:
    table = pa.table({"x": pa.array([float("nan"), None, 1.0], pa.float64()), "row": [0, 1, 2]})
    _, group_keys, _ = _grouped(table, ["x"])
    assert len(group_keys) == 3


# --- _buffered ---------------------------------------------------------------------------------


def batches_of(sizes: list[int]) -> list[pa.RecordBatch]:
    start = 0
    out = []
    for n in sizes:
        out.append(pa.record_batch({"row": pa.array(range(start, start + n), pa.int64())}))
        start += n
    return out


@SETTINGS
@given(sizes=st.lists(st.integers(0, 50), max_size=20), flush_rows=st.integers(1, 120))
def test_buffered_flushes_at_flush_rows_and_loses_nothing(sizes: list[int], flush_rows: int) -> None:
    batches = batches_of(sizes)
    tables = list(_buffered(iter(batches), flush_rows))

    for t in tables[:-1]:
        assert t.num_rows >= flush_rows
        # it flushes as soon as the threshold is reached: without its last batch it was below it
        assert t.num_rows - t.to_batches()[-1].num_rows < flush_rows
    rows = [r for t in tables for r in t.column("row").to_pylist()]
    assert rows == list(range(sum(sizes)))  # every row once, in order
    assert sum(t.num_rows for t in tables) == sum(sizes)
    if not sizes:
        assert tables == []
    elif sum(sizes) < flush_rows:
        assert len(tables) == 1  # the rest is flushed at the end


def test_buffered_of_nothing_yields_nothing() -> None:
    assert list(_buffered(iter([]), 10)) == []


def test_buffered_keeps_the_schema() -> None:
    batch = pa.record_batch({"page": ["/a", None], "n": pa.array([1, 2], pa.int32())})
    (table,) = _buffered(iter([batch, batch]), 100)
    assert table.schema == batch.schema
    assert table.num_rows == 4


def test_plain_temporal_keys_round_trip_to_their_arrow_type() -> None:
    for arr in (pa.array([0, 1_700_000_000_000_000, None], pa.timestamp("us", tz="UTC")),
                pa.array([0, 19_000, None], pa.date32())):
        plain = _plain(pa.chunked_array([arr]))
        assert all(v is None or isinstance(v, int) for v in plain)
        assert _key_array(plain, arr.type).equals(arr)
