"""spark_jobs.jobs.forked and the Arrow file helpers the forked merges use: order, errors, layout."""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_jobs.jobs.forked import forked_map
from spark_jobs.lake import DataFile
from spark_jobs.lake._types import Cluster
from spark_jobs.lake.arrow import file_layout, read_data_files


def _pid_and_square(x: int) -> tuple[int, int]:
    time.sleep(0.05)  # long enough that a forked worker starts and takes some
    return os.getpid(), x * x


def test_results_come_back_in_order_from_other_processes():
    out = forked_map(_pid_and_square, list(range(7)), workers=2)
    assert [v for _, v in out] == [x * x for x in range(7)]
    assert os.getpid() in {pid for pid, _ in out}  # this process takes items too
    assert {pid for pid, _ in out} - {os.getpid()}  # and forked workers
    assert forked_map(_pid_and_square, [3], workers=2) == [(os.getpid(), 9)]
    assert forked_map(_pid_and_square, [], workers=2) == []


def test_tables_come_back_through_shared_memory_and_leave_no_file():
    def table(x: int) -> pa.Table:
        time.sleep(0.05)
        return pa.table({"x": [x] * 3, "pid": [os.getpid()] * 3, "blob": [b"ab" * x] * 3})

    spill = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    before = set(os.listdir(spill))
    out = forked_map(table, list(range(6)), workers=2)
    assert [t.column("x").to_pylist() for t in out] == [[x] * 3 for x in range(6)]
    assert [t.column("blob")[0].as_py() for t in out] == [b"ab" * x for x in range(6)]
    assert {p for t in out for p in t.column("pid").to_pylist()} - {os.getpid()}  # some came from a worker
    assert not {f for f in set(os.listdir(spill)) - before if f.startswith("spark_jobs-")}


def test_a_workers_error_is_raised_here():
    def boom(x: int) -> int:
        if x == 2:
            raise ValueError(f"bad item {x}")
        return x

    with pytest.raises(ValueError, match="bad item 2"):
        forked_map(boom, [0, 1, 2, 3], workers=2)
    assert forked_map(boom, [0, 1], workers=2) == [0, 1]  # and the next map works


def test_file_layout_keeps_every_row_once_by_range_then_partition_sorted_within():
    table = pa.table({"k": [3, 1, None, 2, 1, 3, 2], "day": ["b", "a", "a", None, "b", "a", None],
                      "s": [5, 4, 3, 2, 1, 0, 6], "i": list(range(7))})
    files = file_layout(table, Cluster("k", 2), ["day"], ["s"])
    assert sorted(i for _, f in files for i in f.column("i").to_pylist()) == list(range(7))
    for values, f in files:
        assert f.column("day").to_pylist() == [values["day"]] * f.num_rows
        assert f.column("s").to_pylist() == sorted(f.column("s").to_pylist())
    assert {(v["day"], tuple(f.column("i").to_pylist())) for v, f in files} == {
        ("a", (2, 1)), ("b", (4,)), ("a", (5,)), ("b", (0,)), (None, (3, 6))}  # k < 2 (NULL too), then k >= 2
    kept = file_layout(table, None, (), ())
    assert kept == [({}, table)] and file_layout(table.slice(0, 0), None, ["day"], ()) == []


def test_file_layout_slices_rows_in_a_few_runs_and_splits_a_large_table_without_a_layout(monkeypatch):
    n = 4096  # two sorted runs, the second first (a merge's chunks): written as slices, not copied
    table = pa.concat_tables([pa.table({"t": pa.array(range(n // 2, n)), "i": pa.array(range(n // 2))}),
                              pa.table({"t": pa.array(range(n // 2)), "i": pa.array(range(n // 2, n))})])
    ((_, sorted_rows),) = file_layout(table, None, (), ["t"])
    assert sorted_rows.column("t").to_pylist() == list(range(n)) and sorted_rows.column("t").num_chunks == 2
    shuffled = table.take(pa.array(np.random.default_rng(1).permutation(n)))
    ((_, taken),) = file_layout(shuffled, None, (), ["t"])
    assert taken.column("t").to_pylist() == list(range(n))
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    big = pa.table({"i": pa.array(range(700_000))})
    parts = file_layout(big, None, (), ())
    assert [p.num_rows for _, p in parts] == [350_000, 350_000]  # 700k rows: two files of at least 262,144
    assert pa.concat_tables([p for _, p in parts]).column("i").to_pylist() == list(range(700_000))


def test_data_files_read_with_partition_values_and_later_columns_as_null(tmp_path):
    schema = pa.schema([("x", pa.int64()), ("added", pa.string()), ("day", pa.date32()), ("source", pa.string())])
    (tmp_path / "day=2024-01-02" / "source=batch").mkdir(parents=True)
    pq.write_table(pa.table({"x": pa.array([1, 2], pa.int32())}), tmp_path / "day=2024-01-02/source=batch/a.parquet")
    files = [DataFile("day=2024-01-02/source=batch/a.parquet", 1, 2, {"day": "2024-01-02", "source": "batch"})]
    table = read_data_files(str(tmp_path), files, schema)
    assert table.schema == schema
    assert table.to_pylist() == [{"x": x, "added": None, "day": dt.date(2024, 1, 2), "source": "batch"} for x in (1, 2)]
    assert read_data_files(f"file://{tmp_path}", [], schema).num_rows == 0
