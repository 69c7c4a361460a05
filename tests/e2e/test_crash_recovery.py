"""Crash recovery, end to end: the CLI is killed with SIGKILL at chosen points and rerun.

Every job here runs as ``python -m spark_jobs ...`` in a subprocess, killed
either by a failpoint (``SPARK_JOBS_FAILPOINT=commit:<table>:before|after``, a real
``kill -9`` of the process right before/after a Delta commit) or from outside after a
random delay. Tables are then read with delta-rs only and compared with the DuckDB oracle.
The walk through every commit point runs its jobs as clients of the session's Spark Connect
server (the commit protocol is the client's, as in Airflow's tasks); the random kills run each
job as its own Spark application (a JVM killed with it).
"""

from __future__ import annotations

import functools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from spark_jobs.jobs.generate import GenerateConfig, generate
from spark_jobs.lake import PipelineTables
from spark_jobs.spark_session import ensure_java_home
from spark_jobs.spec import PipelineSpec
from tests.builders import make_spec
from tests.integration.test_bad_files import with_policy
from tests.oracle import actual, assert_matches, expected, read_landing

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
D1, D2, D3 = "2024-03-01", "2024-03-02", "2024-03-03"
KILLED = -signal.SIGKILL
SPARK_OPTS = ("--master", "local[2]", "--shuffle-partitions", "2")


# ----------------------------------------------------------------------------- helpers
def _env(env_extra: dict[str, str] | None = None) -> dict[str, str]:
    ensure_java_home()  # sets JAVA_HOME in this process when unset; the child inherits it
    env = {k: v for k, v in os.environ.items() if k != "SPARK_JOBS_FAILPOINT"}
    env.update({"SPARK_JOBS_DELTA_BACKEND": "embedded", "PYTHONUNBUFFERED": "1", "PYSPARK_PYTHON": sys.executable})
    env.update(env_extra or {})
    return env


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "spark_jobs", *args]


def cli(*args: str, env_extra: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m spark_jobs *args`` in a fresh process; stdout/stderr captured as text."""
    return subprocess.run(_argv(*args), cwd=ROOT, env=_env(env_extra), capture_output=True, text=True,
                          timeout=timeout, check=False)


def job(spec: PipelineSpec, command: str, *args: str, failpoint: str | None = None,
        opts: tuple[str, ...] = SPARK_OPTS) -> subprocess.CompletedProcess:
    extra = {"SPARK_JOBS_FAILPOINT": failpoint} if failpoint else None
    return cli(command, "--pipeline", spec.origin, *opts, *args, env_extra=extra)


def table_frame(path: str | Path, version: int | None = None) -> pd.DataFrame:
    """A Delta table's snapshot read with delta-rs (no Spark)."""
    return DeltaTable(str(path), version=version).to_pandas()


def exists(path: str | Path) -> bool:
    return DeltaTable.is_deltatable(str(path))


def snapshot_files(path: str | Path) -> set[str]:
    """Relative paths of the data files the table's current snapshot references."""
    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    return {unquote(p) for p in actions.column("path").to_pylist()}


def files_on_disk(path: str | Path) -> set[str]:
    root = Path(path)
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts}


def runs(spec: PipelineSpec) -> pd.DataFrame:
    path = PipelineTables(spec.lake, spec.name).runs
    if not exists(path):
        return pd.DataFrame(columns=["run_id", "job", "batch", "status", "message", "versions_written"])
    return table_frame(path).sort_values("started_at").reset_index(drop=True)


def day_rows(partials: pd.DataFrame, date: str) -> pd.DataFrame:
    return partials[partials["event_date"].astype(str) == date]


def _canon(value: object, *, as_set: bool = False) -> object:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, dict):
        return tuple((k, _canon(v)) for k, v in sorted(value.items()))
    if isinstance(value, (list, tuple)):
        items = [_canon(v) for v in value]
        return tuple(sorted(items, key=repr)) if as_set else tuple(items)
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NaT:
        return None
    return value


def canonical_partials(frame: pd.DataFrame) -> list[tuple[object, ...]]:
    """Partial rows without run_id/created_at, sorted by key, cells comparable with ==."""
    cols = [c for c in frame.columns if c not in ("run_id", "created_at")]
    out = [tuple(_canon(row[c], as_set=c.endswith("__set")) for c in cols) for _, row in frame[cols].iterrows()]
    return sorted(out, key=repr)


def partial_keys(spec: PipelineSpec) -> list[str]:
    return ["batch", "source", *spec.key_columns]


def assert_no_duplicate_keys(partials: pd.DataFrame, spec: PipelineSpec) -> None:
    keys = partial_keys(spec)
    dup = partials[partials.duplicated(keys, keep=False)]
    assert dup.empty, f"{len(dup)} partial rows share a (batch, page, window) key:\n{dup[keys].head(10)}"


def assert_oracle(spec: PipelineSpec, landing: Path) -> None:
    tables = PipelineTables(spec.lake, spec.name)
    assert_matches(actual(tables.aggregates, spec), expected(read_landing(landing), spec), spec)


def make_pipeline(tmp_path: Path) -> PipelineSpec:
    spec = make_spec(tmp_path, window={"size": "1 hour"})
    generate(GenerateConfig(out=str(tmp_path / "landing"), days=3, rows_per_day=2000, pages=20, users=300,
                            bad_fraction=0.01), progress=False)
    return spec


def _explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


# ------------------------------------------------------------------------------- tests
@pytest.mark.timeout(1200)
def test_kill_at_every_commit_point_then_rerun(spark_server, tmp_path):
    """Walk through kill -9 right before and right after each commit; a rerun always repairs."""
    spec = make_pipeline(tmp_path)
    on_server = functools.partial(job, opts=("--remote", spark_server.remote, "--shuffle-partitions", "2"))

    tables = PipelineTables(spec.lake, spec.name)
    landing = tmp_path / "landing"

    # 1. combine D1 killed before the partials commit: nothing committed
    proc = on_server(spec, "combine", "--date", D1, failpoint="commit:partials:before")
    assert proc.returncode == KILLED, _explain(proc)
    assert not exists(tables.partials) or day_rows(table_frame(tables.partials), D1).empty
    killed_files = files_on_disk(tables.partials)  # staged data files moved into the table dir, never committed
    assert killed_files, "the killed combine should have left its staged files behind"
    assert not any(runs(spec)["status"] == "success")

    proc = on_server(spec, "combine", "--date", D1)
    assert proc.returncode == 0, _explain(proc)
    assert f"combine {D1} success" in proc.stdout
    assert not day_rows(table_frame(tables.partials), D1).empty
    assert killed_files.isdisjoint(snapshot_files(tables.partials))

    # 2. combine D2 killed right after the partials commit: committed, but no run recorded
    before = DeltaTable(tables.partials).version()
    proc = on_server(spec, "combine", "--date", D2, failpoint="commit:partials:after")
    assert proc.returncode == KILLED, _explain(proc)
    assert DeltaTable(tables.partials).version() == before + 1
    committed_d2 = day_rows(table_frame(tables.partials), D2)
    assert not committed_d2.empty
    recorded = runs(spec)
    assert recorded[(recorded["job"] == "combine") & (recorded["batch"] == D2) & (recorded["status"] == "success")].empty

    # rerun D2 (and combine D3, same process): D2's partials are exactly what the killed run committed
    proc = on_server(spec, "combine", "--date", D2, "--to", D3)
    assert proc.returncode == 0, _explain(proc)
    partials = table_frame(tables.partials)
    rerun_d2 = day_rows(partials, D2)
    assert set(rerun_d2["run_id"]) != set(committed_d2["run_id"])
    assert canonical_partials(rerun_d2) == canonical_partials(committed_d2)
    assert not day_rows(partials, D3).empty
    recorded = runs(spec)
    ok = recorded[(recorded["job"] == "combine") & (recorded["status"] == "success")]
    assert sorted(ok["batch"]) == [D1, D2, D3]

    # 3. first reduce killed before the aggregates commit: no aggregates table
    proc = on_server(spec, "reduce", failpoint="commit:aggregates:before")
    assert proc.returncode == KILLED, _explain(proc)
    assert not exists(tables.aggregates)
    assert files_on_disk(tables.aggregates), "the killed reduce should have left its staged files behind"
    proc = on_server(spec, "reduce")
    assert proc.returncode == 0, _explain(proc)
    assert "reduce success" in proc.stdout
    assert_oracle(spec, landing)

    # 4. backfill D1, then reduce killed right after its commit: merged once, run not recorded
    proc = on_server(spec, "combine", "--date", D1)
    assert proc.returncode == 0, _explain(proc)
    partials_version = DeltaTable(tables.partials).version()
    reduces_before = int((runs(spec)["job"] == "reduce").sum())
    proc = on_server(spec, "reduce", failpoint="commit:aggregates:after")
    assert proc.returncode == KILLED, _explain(proc)
    agg = DeltaTable(tables.aggregates)
    agg_version = agg.version()
    assert agg.transaction_version(f"{spec.name}.reduce") == partials_version
    assert int((runs(spec)["job"] == "reduce").sum()) == reduces_before

    proc = on_server(spec, "reduce")
    assert proc.returncode == 0, _explain(proc)
    assert "reduce noop" in proc.stdout, proc.stdout
    last = runs(spec)
    last = last[last["job"] == "reduce"].iloc[-1]
    assert last["status"] == "noop", last.to_dict()
    assert json.loads(last["versions_read"])["partials_consumed"] == partials_version
    assert DeltaTable(tables.aggregates).version() == agg_version, "the noop rerun committed to aggregates"

    # 5. final state: the oracle, unique partial keys, orphans ignored by readers
    assert_oracle(spec, landing)
    partials = table_frame(tables.partials)
    assert_no_duplicate_keys(partials, spec)
    assert sorted(partials["batch"].unique()) == [D1, D2, D3]
    for path in (tables.partials, tables.aggregates):
        referenced = snapshot_files(path)
        orphans = files_on_disk(path) - referenced
        assert orphans, f"expected files of killed runs under {path}"
        assert referenced <= files_on_disk(path)
        snapshot = table_frame(path)
        counted = sum(pq.read_metadata(Path(path) / f).num_rows for f in referenced)
        everything = sum(pq.read_metadata(Path(path) / f).num_rows for f in files_on_disk(path))
        assert len(snapshot) == counted < everything


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", [5, 2])
def test_kill_run_at_a_random_moment_then_rerun(spark_server, tmp_path, seed):
    """``run`` (combine 3 days + reduce) killed with SIGKILL at a random time; a rerun (on the Connect server, no JVM
    of its own) repairs."""
    spec = make_pipeline(tmp_path)
    tables = PipelineTables(spec.lake, spec.name)
    delay = random.Random(seed).uniform(4, 25)
    args = ("run", "--pipeline", spec.origin, "--from", D1, "--to", D3)
    proc = subprocess.Popen(_argv(*args, *SPARK_OPTS), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + delay
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        finished_first = proc.poll() is not None
        if not finished_first:
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if finished_first:
        print(f"seed {seed}: run finished (exit {proc.returncode}) before the kill at {delay:.1f}s")
    else:
        assert proc.returncode == KILLED, out[-3000:]
        partials = f"v{DeltaTable(tables.partials).version()}" if exists(tables.partials) else "absent"
        aggregates = "present" if exists(tables.aggregates) else "absent"
        print(f"seed {seed}: killed after {delay:.1f}s; partials {partials}, aggregates {aggregates}; "
              f"output:\n{out[-1500:]}")

    rerun = cli(*args, "--remote", spark_server.remote, "--shuffle-partitions", "2")
    assert rerun.returncode == 0, _explain(rerun)
    assert_oracle(spec, tmp_path / "landing")
    partials = table_frame(tables.partials)
    assert_no_duplicate_keys(partials, spec)
    assert sorted(partials["batch"].unique()) == [D1, D2, D3]
    for date, rows in partials.groupby("batch"):
        assert rows["run_id"].nunique() == 1, f"partials of {date} come from several runs: {set(rows['run_id'])}"


def test_a_corrupt_input_file_records_a_failed_run(tmp_path):
    """combine D1..D2 with a corrupt Parquet file in D2 and ``source.on_bad_file: fail``: D1 commits, D2 fails
    with exit 3 and a failed run (the default quarantines the file: tests/integration/test_bad_files.py)."""
    spec = with_policy(make_pipeline(tmp_path), "fail")
    tables = PipelineTables(spec.lake, spec.name)
    corrupt = tmp_path / "landing" / f"event_date={D2}" / "part-00002.parquet"
    corrupt.write_bytes(random.Random(0).randbytes(4096))

    proc = job(spec, "combine", "--date", D1, "--to", D2)
    assert proc.returncode == 3, _explain(proc)
    assert f"combine {D1} success" in proc.stdout
    err = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert err, _explain(proc)
    assert D2 in err[0] and str(corrupt) in err[0], err[0]
    assert "Traceback" not in proc.stderr

    recorded = runs(spec)
    done = recorded[(recorded["batch"] == D1) & (recorded["status"] == "success")]
    failed = recorded[recorded["batch"] == D2]
    assert len(done) == 1 and len(failed) == 1, recorded[["job", "batch", "status"]]
    failed = failed.iloc[0]
    assert failed["job"] == "combine" and failed["status"] == "failed"
    assert failed["message"].startswith("InputError: ") and D2 in failed["message"], failed["message"]
    assert failed["message"].split(": ", 1)[1] in err[0]

    # the failed day changed nothing: partials is still the version D1 wrote, without D2
    d1_version = json.loads(done.iloc[0]["versions_written"])["partials"]
    assert DeltaTable(tables.partials).version() == d1_version
    partials = table_frame(tables.partials)
    assert sorted(partials["batch"].unique()) == [D1]
    assert day_rows(partials, D2).empty
