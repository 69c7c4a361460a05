"""Random spec changes on a live lake, against DuckDB on the raw rows after every step.

Each example walks one lake through a random sequence of: a batch day (combine + reduce), a landed file
streamed, a backfill of some days, and a spec change (keys, windows, aggregates, settings) applied by
``apply``, sometimes a ``python -m spark_jobs apply`` killed with ``kill -9`` at a commit point and run
again. After each step the served ``aggregates`` must equal the model: DuckDB over the rows that count
(the day's batch combine, else its streamed files), grouped by the current spec, with each aggregate NULL
in the windows holding rows processed before the spec version it was added in (0 for the streamed rows of
a day a layout change dropped), and equal otherwise.

``EVOLUTION_EXAMPLES=n`` runs more examples (CI runs a few, new ones each run).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import os
import subprocess
import sys
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from spark_jobs.jobs import combine, reduce
from spark_jobs.jobs.apply import apply
from spark_jobs.lake import PipelineTables
from spark_jobs.lake.spec_record import current
from spark_jobs.spec import PipelineSpec, load_spec
from spark_jobs.spec_plan import compare
from spark_jobs.stream import query as stream
from tests.builders import events
from tests.integration.test_stream import land
from tests.oracle import actual, aggregate_sql, assert_matches

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EXAMPLES = int(os.environ.get("EVOLUTION_EXAMPLES", "2"))
DAYS = ["2024-03-01", "2024-03-02", "2024-03-03"]
MENU = {  # the aggregates a spec may hold
    "views": {"name": "views", "fn": "count"},
    "total_ms": {"name": "total_ms", "fn": "sum", "column": "duration_ms"},
    "max_ms": {"name": "max_ms", "fn": "max", "column": "duration_ms"},
    "users": {"name": "users", "fn": "approx_count_distinct", "column": "user_id"},
    "p50_ms": {"name": "p50_ms", "fn": "approx_percentile", "column": "duration_ms", "args": {"q": 0.5}},
    "first_user": {"name": "first_user", "fn": "first", "column": "user_id"},
}
KILL_POINTS = ["commit:specs:after", "commit:state:after", "commit:partials:after", "commit:aggregates:after"]


def day_files(day: str, seed: int) -> list[pa.Table]:
    """Two files of a day's events (keys never NULL, so a dropped key drops no rejected row)."""
    import random

    rng = random.Random(f"{day}/{seed}")
    midnight = dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC)
    rows = sorted((midnight + dt.timedelta(seconds=rng.randrange(86_400)), f"u{rng.randrange(12)}",
                   rng.choice(["/a", "/b"]), None if rng.random() < 0.1 else rng.randrange(1000), 1.0,
                   rng.choice(["DE", "US"])) for _ in range(40))
    return [events(rows[:20]), events(rows[20:])]


@dataclasses.dataclass(frozen=True)
class Unit:
    """Rows processed together: a day's batch combine, or one streamed file."""

    day: str
    kind: str  # batch | stream
    rows: pa.Table
    version: int


class Model:
    """What the lake must serve: the rows that count, each with the spec version that processed it."""

    def __init__(self) -> None:
        self.batch: dict[str, Unit] = {}
        self.stream: list[Unit] = []
        self.since: dict[str, int] = {}
        self.cutoff: str | None = None

    def counted(self) -> pa.Table | None:
        units = list(self.batch.values()) + [u for u in self.stream if u.day not in self.batch]
        tables = [u.rows.append_column("event_date", pa.array([u.day] * u.rows.num_rows))
                  .append_column("_v", pa.array([u.version] * u.rows.num_rows, pa.int64())) for u in units]
        return pa.concat_tables(tables) if tables else None

    def expected(self, spec: PipelineSpec) -> pd.DataFrame:
        rows = self.counted()
        con = duckdb.connect()
        et = spec.source.event_time
        keys = list(spec.group_by)
        source = "rows"
        if spec.window.tile is not None:
            size = spec.window.tile.seconds
            source = (f"(SELECT *, time_bucket(INTERVAL {size} SECOND, {et}, TIMESTAMPTZ '1970-01-01 00:00:00+00') "
                      f"AS window_start, time_bucket(INTERVAL {size} SECOND, {et}, TIMESTAMPTZ '1970-01-01 00:00:00+00')"
                      f" + INTERVAL {size} SECOND AS window_end FROM rows)")
            keys += ["window_start", "window_end"]
        if rows is None:
            return pd.DataFrame(columns=[*keys, *(a.name for a in spec.aggregates), "n_rows", "_v"])
        con.register("rows", rows)
        select = [*keys, *aggregate_sql(spec), "count(*) AS n_rows", "min(_v) AS _v"]
        group = f"GROUP BY {', '.join(keys)}" if keys else ""
        df = con.sql(f"SELECT {', '.join(select)} FROM {source} {group}").df()
        for k in ("window_start", "window_end"):
            if k in df:
                df[k] = pd.to_datetime(df[k], utc=True)
        return df.sort_values(keys).reset_index(drop=True) if keys else df


def check(spec: PipelineSpec, model: Model) -> None:
    got = actual(PipelineTables(spec.lake, spec.name).aggregates, spec) if os.path.isdir(
        PipelineTables(spec.lake, spec.name).aggregates) else pd.DataFrame()
    want = model.expected(spec)
    if want.empty:
        assert got.empty or got["n_rows"].sum() == 0
        return
    bare = dataclasses.replace(spec, aggregates=())
    assert_matches(got, want, bare)  # the same keys and windows, and rows in each
    for agg in spec.aggregates:
        masked = want["_v"] < model.since[agg.name]
        assert got.loc[masked.values, agg.name].isna().all(), f"{agg.name}: a partial value where NULL is due"
        one = dataclasses.replace(spec, aggregates=(agg,))
        assert_matches(got[~masked.values].reset_index(drop=True), want[~masked.values].reset_index(drop=True), one)


@st.composite
def walks(draw: Any) -> list[tuple[Any, ...]]:
    steps: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(4, 7))):
        kind = draw(st.sampled_from(["combine", "stream", "change", "change", "backfill"]))
        if kind == "combine":
            steps.append(("combine", draw(st.sampled_from(DAYS))))
        elif kind == "stream":
            steps.append(("stream", draw(st.sampled_from(DAYS))))
        elif kind == "backfill":
            steps.append(("backfill", draw(st.lists(st.sampled_from(DAYS), min_size=1, max_size=3, unique=True))))
        else:
            what = draw(st.sampled_from(["add", "drop", "change_fn", "keys", "window", "settings"]))
            kill = draw(st.one_of(st.none(), st.sampled_from(KILL_POINTS)))
            steps.append(("change", what, draw(st.integers(0, 10_000)), kill))
    return steps


def mutate(raw: dict[str, Any], what: str, pick: int) -> dict[str, Any]:
    new = copy.deepcopy(raw)
    names = [a["name"] for a in new["aggregates"]]
    if what == "add":
        free = [n for n in MENU if n not in names]
        if free:
            new["aggregates"].append(copy.deepcopy(MENU[free[pick % len(free)]]))
    elif what == "drop" and len(names) > 1:
        new["aggregates"].pop(pick % len(names))
    elif what == "change_fn":
        for a in new["aggregates"]:
            if a["fn"] in ("max", "min"):
                a["fn"] = "min" if a["fn"] == "max" else "max"
    elif what == "keys":
        new["group_by"] = ["page"] if new["group_by"] == ["page", "country"] else ["page", "country"]
    elif what == "window":
        options = [{"size": "1 hour"}, {"size": "2 hours"}, {"size": "1 day"}, None]
        choice = options[pick % len(options)]
        if choice is None:
            new.pop("window", None)
        else:
            new["window"] = choice
    else:
        new["stream"]["trigger"] = f"{pick % 50 + 1} seconds"
    return new


@settings(max_examples=EXAMPLES, deadline=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(walk=walks(), seed=st.integers(0, 1000))
def test_random_spec_changes_batches_streams_and_kills_match_the_oracle(spark, tmp_path_factory, walk, seed):
    root = tmp_path_factory.mktemp("evolution")
    raw: dict[str, Any] = {
        "name": "views",
        "source": {"path": str(root / "landing"), "format": "parquet", "event_time": "event_time",
                   "schema": {"event_time": "timestamp", "user_id": "string", "page": "string",
                              "duration_ms": "long", "weight": "double", "country": "string"}},
        "group_by": ["page", "country"], "window": {"size": "1 hour"},
        "aggregates": [copy.deepcopy(MENU[n]) for n in ("views", "total_ms", "max_ms", "users")],
        "stream": {"watermark": "30 days"},  # nothing is late: the model needs no watermark
        "lake": str(root / "lake"),
    }
    path = root / "views.yaml"

    def load(r: dict[str, Any]) -> PipelineSpec:
        path.write_text(yaml.safe_dump(r, sort_keys=False))
        return load_spec(path)

    spec = load(raw)
    model = Model()
    model.since = {a["name"]: 1 for a in raw["aggregates"]}
    version = 1
    files = {day: day_files(day, seed) for day in DAYS}
    landed = {day: 0 for day in DAYS}

    def land_next(day: str) -> pa.Table | None:
        if landed[day] == len(files[day]):
            return None
        table = files[day][landed[day]]
        land(root / "landing", day, table)
        landed[day] += 1
        return table

    def recombine(day: str) -> None:
        if landed[day] == 0:
            land_next(day)
        combine.run(spark, spec, day)
        model.batch[day] = Unit(day, "batch", pa.concat_tables(files[day][:landed[day]]), version)

    for step in walk:
        if step[0] == "combine":
            recombine(step[1])
            reduce.run(spark, spec)
        elif step[0] == "backfill":
            for day in step[1]:
                recombine(day)
            reduce.run(spark, spec)
        elif step[0] == "stream":
            table = land_next(step[1])
            if table is None:
                continue
            stream.run(spark, spec, available_now=True)
            v = 0 if model.cutoff is not None and step[1] <= model.cutoff else version
            model.stream.append(Unit(step[1], "stream", table, v))
        else:
            _, what, pick, kill = step
            new_raw = mutate(raw, what, pick)
            if new_raw == raw:
                continue
            new = load(new_raw)
            fresh = current(new.lake, new.name) is None  # no job yet: apply records the new spec as version 1
            if kill is not None:
                env = {**os.environ, "SPARK_JOBS_FAILPOINT": f"{kill}@1"}
                proc = subprocess.run([sys.executable, "-m", "spark_jobs", "apply", "--pipeline", str(path)],
                                      env=env, capture_output=True, text=True, timeout=300, check=False)
                assert proc.returncode in (0, -9), proc.stderr
            diff = compare(spec, new)
            result = apply(new)  # finishes a killed apply, or finds it done
            record = current(new.lake, new.name)
            assert record is not None and record.applied and record.version == result.version
            assert record.version == (1 if fresh else version + 1)
            if fresh:
                diff = compare(new, new)
            if diff.reset:  # every stored row goes; the stream's rows of those days count as no version
                dropped = [*model.batch, *(u.day for u in model.stream), *([model.cutoff] if model.cutoff else [])]
                model.cutoff = max(dropped) if dropped else None
                model.batch, model.stream = {}, []
            version = record.version
            assert record.coverage == {a.name: version if diff.reset or a.name in diff.added else model.since.get(a.name, 1)
                                       for a in new.aggregates}
            model.since = dict(record.coverage)
            raw, spec = new_raw, new
        check(spec, model)
