"""One changelog for every writer: folded in order, it equals ``aggregates`` at every version.

Random interleavings of landed files, stream runs, combines, reduces (plain and ``--full``), backfills of a day
and one ``apply`` (an aggregate added, or the windows coarsened) run on one lake. Then ``changelog``, folded in
(``aggregates_version``, ``seq``) order, must rebuild ``aggregates`` as Delta holds it at each of its versions;
each ``-U`` and ``-D`` must carry the values the fold holds for its row, and each ``+I`` name a row it lacks.
The oracle is the table's own history, read with delta-rs: no code of the product folds or compares.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from spark_jobs.__main__ import main
from spark_jobs.jobs import combine, reduce
from spark_jobs.jobs.apply import apply
from spark_jobs.lake import PipelineTables, time_chunks
from spark_jobs.lake.layout import value_fields
from spark_jobs.phases.changelog_rule import ChangelogRule
from spark_jobs.spec import PipelineSpec, load_spec
from spark_jobs.stream import query as stream
from tests.builders import day_events, make_spec
from tests.integration.test_stream import land

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DAYS = ("2024-03-01", "2024-03-02")
AGGREGATES = [{"name": "views", "fn": "count"}, {"name": "total_ms", "fn": "sum", "column": "duration_ms"},
              {"name": "max_ms", "fn": "max", "column": "duration_ms"}]
# Random interleavings: CI runs a few, CHANGELOG_FOLD_EXAMPLES=200 the full property
EXAMPLES = int(os.environ.get("CHANGELOG_FOLD_EXAMPLES", "3"))
STEP = st.one_of(
    st.tuples(st.just("land"), st.integers(0, 1), st.integers(1, 40), st.integers(0, 10_000)),
    st.tuples(st.just("stream")), st.tuples(st.just("combine"), st.integers(0, 1)), st.tuples(st.just("reduce")),
    st.tuples(st.just("full")), st.tuples(st.just("backfill"), st.integers(0, 1)),
    st.tuples(st.just("apply"), st.sampled_from(["add", "coarsen", "drop"])))


@pytest.fixture(autouse=True)
def changes_told_a_day_at_a_time(monkeypatch):
    """A full reduce's change is told a day of windows at a time, as on a large table."""
    monkeypatch.setattr(time_chunks, "CHUNK_BYTES", 1)


def _changed(spec: PipelineSpec, how: str) -> PipelineSpec:
    raw = yaml.safe_load(Path(spec.origin).read_text())
    if how == "add":
        raw["aggregates"].append({"name": "min_ms", "fn": "min", "column": "duration_ms"})
    elif how == "drop":
        raw["group_by"] = []
    else:
        raw["window"] = {"size": "2 hours"}
    Path(spec.origin).write_text(yaml.safe_dump(raw))
    return load_spec(spec.origin)


def _run(spark: Any, spec: PipelineSpec, step: tuple[Any, ...], root: Path, applied: list[str]) -> PipelineSpec:
    tables, kind = PipelineTables(spec.lake, spec.name), step[0]
    landed = [d for d in DAYS if (root / "landing" / f"event_date={d}").exists()]
    if kind == "land":
        _, day, n, seed = step
        land(root / "landing", DAYS[day], day_events(DAYS[day], n, seed=seed, pages=("/a", "/b", None)))
    elif kind == "stream" and landed:
        stream.run(spark, spec, available_now=True)
    elif kind in ("combine", "backfill") and DAYS[step[1]] in landed:
        combine.run(spark, spec, DAYS[step[1]])
        if kind == "backfill":
            reduce.run(spark, spec)
    elif kind in ("reduce", "full") and DeltaTable.is_deltatable(tables.partials):
        reduce.run(spark, spec, full=kind == "full")
    elif kind == "apply" and not applied:
        applied.append(step[1])
        spec = _changed(spec, step[1])
        apply(spec, spark=lambda: spark)
    return spec


def _served(path: str, version: int, identity: list[str], values: list[str]) -> dict[tuple[Any, ...], list[Any]]:
    """``aggregates`` at ``version``: each existing row's values by identity (a column it lacks reads NULL)."""
    table = DeltaTable(path, version=version).to_pyarrow_table()
    rows = table.to_pylist()
    return {tuple(r.get(c) for c in identity): [r.get(c) for c in values] for r in rows if r["n_rows"] != 0}


def _assert_fold_equals_every_version(spec: PipelineSpec) -> int:
    """Folded by the identity with ``page`` in it, which rows read NULL since a drop of the key."""
    tables = PipelineTables(spec.lake, spec.name)
    rule = ChangelogRule.of(spec, [f.name for f in value_fields(spec)])
    identity, values = ["page", *(c for c in rule.identity if c != "page")], list(rule.values)
    latest = DeltaTable(tables.aggregates).version()
    log: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in DeltaTable(tables.changelog).to_pyarrow_table().to_pylist():
        assert row["aggregates_version"] is not None and row["writer"] in ("stream", "reduce", "apply"), row
        log[row["aggregates_version"]].append(row)
    assert max(log, default=-1) <= latest
    folded: dict[tuple[Any, ...], list[Any]] = {}
    for version in range(latest + 1):
        for row in sorted(log[version], key=lambda r: r["seq"]):
            key, held = tuple(row.get(c) for c in identity), [row.get(c) for c in values]
            where = f"version {version}, {row['writer']} {row['op']} {key}"
            if row["op"] == "+I":
                assert key not in folded, f"{where}: inserts a row the log already holds"
            elif row["op"] in ("-U", "-D"):
                assert folded.get(key) == held, f"{where}: retracts {held}, the log holds {folded.get(key)}"
            if row["op"] == "-D":
                del folded[key]
            elif row["op"] in ("+I", "+U"):
                folded[key] = held
        assert folded == _served(tables.aggregates, version, identity, values), f"aggregates version {version}"
    return sum(len(rows) for rows in log.values())


@settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=st.lists(STEP, min_size=3, max_size=9))
def test_the_folded_changelog_equals_aggregates_at_every_version(spark, tmp_path_factory, steps):
    _fold_case(spark, tmp_path_factory.mktemp("fold"), steps)


def test_a_stream_batch_over_a_day_combined_but_not_reduced_tells_what_it_serves(spark, tmp_path):
    """Found by the property (seed 1002): the stream serves a combined day from its batch partials, which
    ``aggregates`` does not hold until a reduce; its changelog's before side is the served rows as they are."""
    _fold_case(spark, tmp_path, [("land", 1, 6, 2341), ("combine", 1), ("stream",)])


def test_a_first_stream_batch_over_a_combined_day_tells_every_row_it_serves(spark, tmp_path):
    """No ``aggregates`` yet: the combined day's rows the stream serves are all new (``+I``)."""
    _fold_case(spark, tmp_path, [("combine", 0), ("stream",)], start=[("land", 0, 30, 1)])


def test_a_dropped_key_tells_each_old_row_deleted_under_its_key_then_each_new_row_inserted(spark, tmp_path):
    """The rows of many old keys merge into one new row: matched by the new identity alone, each old row would read
    as an update of it; told as ``-D`` with its old key, then ``+I``, a consumer keyed either way folds them."""
    spec = make_spec(tmp_path, name="fold", window={"size": "1 hour"}, aggregates=AGGREGATES)
    tables = PipelineTables(spec.lake, spec.name)
    land(tmp_path / "landing", DAYS[0], day_events(DAYS[0], 60, seed=3, pages=("/a", "/b", None)))
    combine.run(spark, spec, DAYS[0])
    reduce.run(spark, spec)
    old = DeltaTable(tables.aggregates).to_pyarrow_table()
    apply(_changed(spec, "drop"), spark=lambda: spark)
    new = DeltaTable(tables.aggregates).to_pyarrow_table()
    log = DeltaTable(tables.changelog).to_pyarrow_table()
    told = log.filter(pa.compute.equal(log["writer"], "apply")).sort_by("seq").to_pylist()
    assert [r["op"] for r in told] == ["-D"] * old.num_rows + ["+I"] * new.num_rows
    assert {(r["page"], r["window_start"]) for r in told[:old.num_rows]} == set(
        zip(old["page"].to_pylist(), old["window_start"].to_pylist(), strict=True))
    assert all(r["page"] is None for r in told[old.num_rows:])
    assert _assert_fold_equals_every_version(spec) == log.num_rows


def _fold_case(spark: Any, root: Path, steps: list[tuple[Any, ...]],
               start: tuple[tuple[Any, ...], ...] | list[tuple[Any, ...]] = (("land", 0, 30, 1), ("stream",))) -> None:
    spec = make_spec(root, name="fold", window={"size": "1 hour"}, aggregates=AGGREGATES)
    steps = [*start, *steps, ("land", 1, 20, 2), ("backfill", 0), ("stream",)]
    applied: list[str] = []
    for step in steps:
        spec = _run(spark, spec, step, root, applied)
    assert _assert_fold_equals_every_version(spec) > 0


def test_each_writer_tells_its_change(spark, tmp_path, capsys):
    """A streamed day superseded by its batch combine, a late file recounted, a backfill and an apply each leave
    rows in the log, stamped with their writer, run and the ``aggregates`` version they made."""
    spec = make_spec(tmp_path, name="fold", window={"size": "1 hour"}, aggregates=AGGREGATES)
    landing, tables = tmp_path / "landing", PipelineTables(spec.lake, spec.name)
    land(landing, DAYS[0], day_events(DAYS[0], 40, seed=1, pages=("/a", None)))
    stream.run(spark, spec, available_now=True)
    land(landing, DAYS[0], day_events(DAYS[0], 10, seed=2, pages=("/a", None)))  # late for most of its windows
    combine.run(spark, spec, DAYS[0])
    reduce.run(spark, spec)
    spec = _changed(spec, "coarsen")
    apply(spec, spark=lambda: spark)
    log = DeltaTable(tables.changelog).to_pyarrow_table()
    writers = {w: set(v for v, ww in zip(log["aggregates_version"].to_pylist(), log["writer"].to_pylist(),
                                         strict=True) if ww == w)
               for w in ("stream", "reduce", "apply")}
    assert all(writers.values()), writers
    runs = {r["job"]: r["run_id"] for r in DeltaTable(tables.runs).to_pyarrow_table().to_pylist()}
    reduce_rows = log.filter(pa.compute.equal(log["writer"], "reduce"))
    assert set(reduce_rows["run_id"].to_pylist()) == {runs["reduce"]}
    assert {"-U", "+U"} <= set(reduce_rows["op"].to_pylist())  # the batch superseded the streamed values
    assert _assert_fold_equals_every_version(spec) == log.num_rows
    # one key's history, as a user reads it
    assert main(["inspect", "show", "fold.changelog", "--lake", spec.lake, "--where", "page IS NULL", "--json",
                 "--order-by", "aggregates_version,seq", "--limit", "10000"]) == 0
    shown = json.loads(capsys.readouterr().out)
    history = log.filter(pa.compute.is_null(log["page"])).sort_by([("aggregates_version", "ascending"),
                                                                   ("seq", "ascending")])
    assert [(r["op"], r["writer"], r["aggregates_version"]) for r in shown] == list(zip(
        history["op"].to_pylist(), history["writer"].to_pylist(), history["aggregates_version"].to_pylist(),
        strict=True))
