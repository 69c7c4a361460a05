"""A tiny lake with history, built by the real jobs, for the inspect CLI and web view tests.

Pipeline ``views`` (hourly windows, built-in aggregates only, so no Python workers):

- ``partials`` v0: combine 2024-03-01; v1: combine 2024-03-02 (pages /a /b /c);
  v2: 2024-03-02 landed again with pages /b /c /d and combined (replaces the day).
- ``aggregates`` v0: reduce after v1; v1: reduce after v2 (the day's /a windows go, /d
  windows come, /b and /c windows change).
- ``dead_letter``: 2 rejected rows a day; ``runs``: five runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from spark_jobs.jobs import combine, reduce
from spark_jobs.spec import PipelineSpec
from tests.builders import FAST_AGGREGATES, day_events, make_spec, write_day

D1, D2 = "2024-03-01", "2024-03-02"
PIPELINE = "views"


_BUILT: dict[str, PipelineSpec] = {}


def shared_lake(spark, tmp_path_factory) -> PipelineSpec:
    """The lake, built once per test session (the CLI and the web view tests read the same one)."""
    if "spec" not in _BUILT:
        _BUILT["spec"] = build_lake(spark, tmp_path_factory.mktemp("inspect_lake"))
    return _BUILT["spec"]


def build_lake(spark, root: Path) -> PipelineSpec:
    """Run the jobs into ``root/lake``; returns the spec (its file is ``root/views.yaml``)."""
    spec = make_spec(root, name=PIPELINE, aggregates=FAST_AGGREGATES, window={"size": "1 hour"})
    landing = root / "landing"
    write_day(landing, D1, day_events(D1, 40, rejected=2))
    write_day(landing, D2, day_events(D2, 40, rejected=2))
    combine.run(spark, spec, D1)
    combine.run(spark, spec, D2)
    reduce.run(spark, spec)
    write_day(landing, D2, day_events(D2, 40, seed=1, pages=("/b", "/c", "/d"), rejected=2))
    combine.run(spark, spec, D2)
    reduce.run(spark, spec)
    return spec


def snapshot(lake_dir: str) -> dict[str, tuple[int, int]]:
    """Every file under the lake with its size and mtime: proof that nothing was written."""
    out = {}
    for dirpath, _, names in os.walk(lake_dir):
        for n in names:
            st = os.stat(os.path.join(dirpath, n))
            out[os.path.join(dirpath, n)] = (st.st_size, st.st_mtime_ns)
    return out
