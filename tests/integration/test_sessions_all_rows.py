"""The stream over sessions of all rows (``window: {gap}``, no ``group_by``), with either merge engine.

Every row joins one run of sessions, whatever its user or page. Each landing file is a mini-batch: sessions grow,
a row out of order extends one, a row bridges two served sessions, a session crosses midnight, and a row older
than the watermark goes to dead_letter. The served sessions must equal gaps and islands over the rows the stream
counted (a plain-Python one here for the bounds and row counts, DuckDB's in tests/oracle for every aggregate), and
the changelog folded in (``aggregates_version``, ``seq``) order must equal ``aggregates`` at each of its versions.
The driver engine takes these small batches; ``driver_max_keys=0`` sends every one to the Spark engine.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from spark_jobs.lake import PipelineTables
from spark_jobs.spec import PipelineSpec
from spark_jobs.stream import query as stream
from spark_jobs.stream.arrow_engine import DRIVER_MAX_KEYS
from spark_jobs.stream.query import StreamSummary
from tests.builders import FAST_AGGREGATES, day_events, events, make_spec
from tests.integration.test_stream import land, with_stream
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

D0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
GAP = dt.timedelta(minutes=30)
ENGINES = {"driver": DRIVER_MAX_KEYS, "spark": 0}  # driver_max_keys: 0 sends every batch to Spark


def at(hh: int, mm: int = 0, day: int = 0) -> dt.datetime:
    return D0 + dt.timedelta(days=day, hours=hh, minutes=mm)


def ev(t: dt.datetime, user: str, ms: int = 100) -> tuple[Any, ...]:
    return (t, user, "/a", ms, 1.0, "DE")


def all_rows_spec(root: Path, watermark: str) -> PipelineSpec:
    spec = make_spec(root, window={"gap": "30 minutes"}, group_by=[], aggregates=FAST_AGGREGATES)
    return with_stream(spec, max_files_per_batch=1, watermark=watermark)


def run(spark: Any, spec: PipelineSpec, engine: str) -> StreamSummary:
    summary = stream.run(spark, spec, available_now=True, driver_max_keys=ENGINES[engine])
    assert [b.on_driver for b in summary.batches] == [engine == "driver"] * len(summary.batches)
    return summary


def islands(times: list[dt.datetime]) -> list[tuple[dt.datetime, dt.datetime, int]]:
    """Gaps and islands over all rows: (first event, last event + gap, rows) of each run of events at most ``GAP``
    apart."""
    out: list[tuple[dt.datetime, dt.datetime, int]] = []
    for t in sorted(times):
        if out and t <= out[-1][1]:
            out[-1] = (out[-1][0], t + GAP, out[-1][2] + 1)
        else:
            out.append((t, t + GAP, 1))
    return out


def served(spec: PipelineSpec) -> list[tuple[dt.datetime, dt.datetime, int]]:
    rows = DeltaTable(PipelineTables(spec.lake, spec.name).aggregates).to_pyarrow_table(
        columns=["window_start", "window_end", "n_rows"]).to_pylist()
    return sorted((r["window_start"], r["window_end"], r["n_rows"]) for r in rows if r["n_rows"])


def check_oracle(spec: PipelineSpec, root: Path, late: frozenset[dt.datetime] = frozenset()) -> None:
    """The served sessions equal gaps and islands over the landed rows, the ``late`` event times left out."""
    raw = read_landing(root / "landing")
    if late:
        raw = raw.filter(pc.invert(pc.is_in(raw["event_time"], pa.array(sorted(late), raw["event_time"].type))))
    assert served(spec) == islands(raw.column("event_time").to_pylist())
    assert_matches(actual(PipelineTables(spec.lake, spec.name).aggregates, spec), expected(raw, spec), spec)


def check_fold(spec: PipelineSpec) -> list[dict[str, Any]]:
    """Fold the changelog in (``aggregates_version``, ``seq``) order; at each version of ``aggregates`` it must hold
    that version's sessions (by start: sessions of all rows never overlap), each ``-U``/``-D`` retracting the values
    the fold holds. The log, in that order."""
    tables = PipelineTables(spec.lake, spec.name)
    log = sorted(DeltaTable(tables.changelog).to_pyarrow_table().to_pylist(),
                 key=lambda r: (r["aggregates_version"], r["seq"]))
    values = ["window_end", *(a["name"] for a in FAST_AGGREGATES)]
    folded: dict[dt.datetime, list[Any]] = {}
    pending = iter(log)
    row = next(pending, None)
    for version in range(DeltaTable(tables.aggregates).version() + 1):
        while row is not None and row["aggregates_version"] <= version:
            held, start = [row[c] for c in values], row["window_start"]
            if row["op"] in ("-U", "-D"):
                assert folded.pop(start) == held, f"version {version}: {row['op']} of {start} retracts {held}"
            else:  # +I, or the +U after its -U
                assert start not in folded, f"version {version}: {row['op']} of {start}, which the fold holds"
                folded[start] = held
            row = next(pending, None)
        table = DeltaTable(tables.aggregates, version=version).to_pyarrow_table().to_pylist()
        assert folded == {r["window_start"]: [r[c] for c in values] for r in table if r["n_rows"]}, \
            f"aggregates version {version}"
    assert row is None, f"changelog rows of versions aggregates lacks: {row}"
    return log


# one landing file per mini-batch; the watermark is an hour behind the latest event before the batch
STORY = [
    [ev(at(10), "u1"), ev(at(10, 20), "u2"), ev(at(11, 30), "u3")],  # A [10:00, 10:50) and B [11:30, 12:00)
    [ev(at(11, 50), "u1"), ev(at(10, 40), "u4")],  # B grows; out of order, open at watermark 10:30, A grows
    [ev(at(11, 5), "u2"), ev(at(9), "u5"), ev(at(23, 50), "u1")],  # bridges A and B; 09:00 late at 10:50; C
    [ev(at(0, 10, day=1), "u3")],  # C grows across midnight
]
LATE = frozenset({at(9)})


@pytest.mark.parametrize("engine", list(ENGINES))
def test_sessions_of_all_rows_grow_merge_and_cross_midnight_batch_by_batch(spark, tmp_path, engine):
    spec = all_rows_spec(tmp_path, watermark="1 hour")
    for rows in STORY:
        land(tmp_path / "landing", rows[0][0].date().isoformat(), events(rows))
    summary = run(spark, spec, engine)
    assert [b.rows_late for b in summary.batches] == [0, 0, 1, 0]
    dead = DeltaTable(PipelineTables(spec.lake, spec.name).dead_letter).to_pandas()
    assert len(dead) == 1 and dead["reason"][0].startswith("late: 2024-03-01 09:00:00"), dead["reason"].tolist()
    assert served(spec) == [(at(10), at(12, 20), 6), (at(23, 50), at(0, 40, day=1), 2)]
    check_oracle(spec, tmp_path, LATE)
    log = check_fold(spec)
    assert [(r["batch_id"], r["op"], r["window_start"], r["window_end"], r["views"]) for r in log] == [
        (0, "+I", at(10), at(10, 50), 2), (0, "+I", at(11, 30), at(12), 1),
        (1, "-U", at(10), at(10, 50), 2), (1, "+U", at(10), at(11, 10), 3),
        (1, "-U", at(11, 30), at(12), 1), (1, "+U", at(11, 30), at(12, 20), 2),
        (2, "-U", at(10), at(11, 10), 3), (2, "+U", at(10), at(12, 20), 6), (2, "-D", at(11, 30), at(12, 20), 2),
        (2, "+I", at(23, 50), at(0, 20, day=1), 1),
        (3, "-U", at(23, 50), at(0, 20, day=1), 1), (3, "+U", at(23, 50), at(0, 40, day=1), 2)]


@pytest.mark.parametrize("engine", list(ENGINES))
def test_shuffled_files_over_two_days_give_the_oracle(spark, tmp_path, engine):
    """About one event per 36 minutes, shuffled within its day: each file's sessions bridge, extend and split the
    served ones, and the watermark (a day) lets every row count."""
    spec = all_rows_spec(tmp_path, watermark="1 day")
    for day, files in (("2024-03-01", 2), ("2024-03-02", 1)):
        rows = day_events(day, 40, seed=3)
        rows = rows.take(random.Random(day).sample(range(rows.num_rows), rows.num_rows))
        step = -(-rows.num_rows // files)
        for i in range(files):
            land(tmp_path / "landing", day, rows.slice(i * step, step))
    summary = run(spark, spec, engine)
    assert len(summary.batches) == 3 and sum(b.rows_late for b in summary.batches) == 0
    assert 5 < len(served(spec)) < 60  # runs of events, neither one session nor one per event
    check_oracle(spec, tmp_path)
    check_fold(spec)
