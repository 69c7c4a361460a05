"""``count_distinct`` over a changelog (CDC) source: a count per value (a map view, as Flink's distinct aggregate
keeps it), so -U/-D rows retract their value in the stream and in the batch path, and the served count equals
DuckDB's ``count(DISTINCT)`` over the rows live after the retractions (``tests.oracle.live_rows``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from spark_jobs.jobs import combine, reduce
from spark_jobs.lake import PipelineTables
from spark_jobs.lake.table_rules import BATCH
from spark_jobs.spec import PipelineSpec, load_spec
from spark_jobs.stream import query as stream
from tests.integration.test_stream import cdc_rows, cdc_spec, changelog, land
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.spark

# per name, the distinct scores live after each batch: Tom {10, 20} (10 twice), {10, 20}, {20} (10 retracted to
# zero), {10, 20, 30} (10 re-added); John {5}, {6}, then deleted; Ann inserted, deleted and inserted in one batch
BATCHES = [
    [("+I", "Tom", 10), ("+I", "Tom", 10), ("+I", "Tom", 20), ("+I", "John", 5)],
    [("-D", "Tom", 10), ("-U", "John", 5), ("+U", "John", 6)],
    [("-D", "Tom", 10)],
    [("+I", "Tom", 10), ("+I", "Tom", 30), ("-D", "John", 6), ("+I", "Ann", 7), ("-D", "Ann", 7), ("+I", "Ann", 8)],
]


def distinct_spec(root: Path, **stream_conf: Any) -> PipelineSpec:
    """test_stream's changelog pipeline with ``count_distinct`` of the score as ``scores``; its event time is
    ``changed_at`` (``at`` is a keyword to DuckDB, which the oracle's SQL names unquoted)."""
    path = Path(cdc_spec(root, udaf=False, **stream_conf).origin)
    raw = yaml.safe_load(path.read_text())
    raw["aggregates"].append({"name": "scores", "fn": "count_distinct", "column": "score"})
    source = raw["source"]
    source["event_time"], source["schema"] = "changed_at", {("changed_at" if c == "at" else c): t
                                                            for c, t in source["schema"].items()}
    path.write_text(yaml.safe_dump(raw))
    return load_spec(path)


def changes(rows: list[tuple[str, str, int]], start: int) -> pa.Table:
    """test_stream's ``cdc_rows`` with the event time as ``changed_at``."""
    table = cdc_rows(rows, start)
    return table.rename_columns(["changed_at" if c == "at" else c for c in table.column_names])


def served(spec: PipelineSpec) -> dict[str, tuple[int, int]]:
    """name -> (cnt, scores) as ``aggregates`` serves them."""
    df = actual(PipelineTables(spec.lake, spec.name).aggregates, spec)
    return {r.name: (r.cnt, r.scores) for r in df.itertuples()}


def assert_oracle(spec: PipelineSpec) -> None:
    want = expected(read_landing(spec.source.path), spec)
    assert_matches(actual(PipelineTables(spec.lake, spec.name).aggregates, spec), want, spec)


@pytest.mark.parametrize("driver_max_keys", [0, None], ids=["spark-merge", "driver-merge"])
def test_the_stream_retracts_count_distinct_and_the_batch_path_agrees(spark, tmp_path, driver_max_keys):
    spec = distinct_spec(tmp_path, max_files_per_batch=1)
    for i, batch in enumerate(BATCHES):
        land(tmp_path / "landing", "2024-03-01", changes(batch, start=10 * i))
    engine = {} if driver_max_keys is None else {"driver_max_keys": driver_max_keys}
    summary = stream.run(spark, spec, available_now=True, **engine)
    assert [b.on_driver for b in summary.batches] == [driver_max_keys is None] * len(BATCHES)
    log = changelog(spec)
    assert sorted((r.batch_id, r.name, r.op, r.cnt, r.scores) for r in log.itertuples()) == [
        (0, "John", "+I", 1, 1), (0, "Tom", "+I", 3, 2),
        (1, "John", "+U", 1, 1), (1, "John", "-U", 1, 1), (1, "Tom", "+U", 2, 2), (1, "Tom", "-U", 3, 2),
        (2, "Tom", "+U", 1, 1), (2, "Tom", "-U", 2, 2),
        (3, "Ann", "+I", 1, 1), (3, "John", "-D", 1, 1), (3, "Tom", "+U", 3, 3), (3, "Tom", "-U", 1, 1),
    ]
    assert served(spec) == {"Ann": (1, 1), "Tom": (3, 3)}
    assert_oracle(spec)
    combine.run(spark, spec, "2024-03-01")  # the day's batch partials supersede the stream's
    reduce.run(spark, spec)
    assert served(spec) == {"Ann": (1, 1), "Tom": (3, 3)}
    assert_oracle(spec)


# day 1 inserts; day 2 retracts some of them: its partials hold negative counts (Tom {10: -1, 30: 1}, John {5: -1})
DAY1 = [("+I", "Tom", 10), ("+I", "Tom", 20), ("+I", "Tom", 20), ("+I", "John", 5)]
DAY2 = [("-D", "Tom", 10), ("+I", "Tom", 30), ("-D", "John", 5), ("-U", "Tom", 20), ("+U", "Tom", 20),
        ("+I", "Ann", 7)]


def test_partials_with_negative_counts_merge_to_the_live_rows_in_batch_and_stream(spark, tmp_path):
    spec = distinct_spec(tmp_path, max_files_per_batch=1)
    land(tmp_path / "landing", "2024-03-01", changes(DAY1, start=0))
    land(tmp_path / "landing", "2024-03-02", changes(DAY2, start=24 * 60))
    stream.run(spark, spec, available_now=True, driver_max_keys=0)
    want = {"Ann": (1, 1), "Tom": (3, 2)}  # Tom: 20 twice and 30; John retracted to nothing, gone
    assert served(spec) == want
    assert_oracle(spec)
    for day in ("2024-03-01", "2024-03-02"):
        combine.run(spark, spec, day)
    partials = DeltaTable(PipelineTables(spec.lake, spec.name).partials).to_pandas()
    day2 = partials[(partials["source"] == BATCH) & (partials["event_date"].astype(str) == "2024-03-02")]
    assert {r.name: (r.n_rows, dict(r.scores__counts)) for r in day2.itertuples()} == {
        "Tom": (0, {10: -1, 30: 1}), "John": (-1, {5: -1}), "Ann": (1, {7: 1})}
    reduce.run(spark, spec)
    assert served(spec) == want
    assert_oracle(spec)
