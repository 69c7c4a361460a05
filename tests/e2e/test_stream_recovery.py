"""The stream as users run it, ``python -m spark_jobs stream``, killed with SIGKILL or stopped with SIGTERM.

A failpoint (``SPARK_JOBS_FAILPOINT=commit:<table>:before|after@n``) kills the process for
real at a chosen commit of the n-th mini-batch; a restart must leave every table exactly as
an uninterrupted run leaves it. The restarts and the uninterrupted run go on from the same checkpoint in this
test process's session (no JVM of their own), but where the CLI's own words are checked.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from spark_jobs.lake import PipelineTables
from spark_jobs.spark_session import ensure_java_home
from spark_jobs.spec import load_spec
from spark_jobs.stream import query as stream
from spark_jobs.stream.query import StreamSummary
from tests.integration.test_stream import land

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
KILLED = -signal.SIGKILL


def _env(failpoint: str | None = None) -> dict[str, str]:
    ensure_java_home()
    env = {k: v for k, v in os.environ.items() if k != "SPARK_JOBS_FAILPOINT"}
    env.update({"SPARK_JOBS_DELTA_BACKEND": "embedded", "PYTHONUNBUFFERED": "1", "PYSPARK_PYTHON": sys.executable})
    if failpoint:
        env["SPARK_JOBS_FAILPOINT"] = failpoint
    return env


def _argv(spec_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spark_jobs", "stream", "--pipeline", str(spec_path), "--master", "local[2]",
            "--shuffle-partitions", "2", *extra]


def stream_cli(spec_path: Path, failpoint: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(_argv(spec_path, "--available-now"), cwd=ROOT, env=_env(failpoint), capture_output=True,
                          text=True, timeout=600, check=False)


def restart(spark: SparkSession, spec_path: Path) -> StreamSummary:
    """The stream, available-now, in this process's session."""
    return stream.run(spark, load_spec(spec_path), available_now=True)


def make_pipeline(root: Path, trigger: str = "1 second") -> Path:
    raw = {"name": "clicks", "lake": str(root / "lake"), "group_by": ["page"], "window": {"size": "1 hour"},
           "source": {"path": str(root / "landing"), "format": "parquet", "event_time": "at",
                      "schema": {"at": "timestamp", "page": "string", "ms": "long"}},
           "aggregates": [{"name": "clicks", "fn": "count"}, {"name": "total_ms", "fn": "sum", "column": "ms"},
                          {"name": "max_ms", "fn": "max", "column": "ms"}],
           "stream": {"max_files_per_batch": 1, "trigger": trigger, "watermark": "30 minutes"}}
    root.mkdir(parents=True, exist_ok=True)
    (root / "clicks.yaml").write_text(yaml.safe_dump(raw))
    return root / "clicks.yaml"


def land_files(root: Path, first: int = 0, count: int = 4) -> None:
    """Files of 20 clicks each, 40 minutes apart: later files close earlier windows; one late row each."""
    for i in range(first, first + count):
        start = T0 + dt.timedelta(minutes=40 * i)
        at = [start + dt.timedelta(minutes=2 * j) for j in range(20)] + [T0]  # T0 is late from file 2 on
        pages = [f"/p{(i + j) % 3}" for j in range(21)]
        land(root / "landing", "2024-03-01", pa.table({
            "at": pa.array(at, pa.timestamp("us", tz="UTC")), "page": pages, "ms": pa.array(range(21), pa.int64())}))


def snapshot(spec_path: Path) -> dict[str, pd.DataFrame]:
    """Every table's content, without run ids and timestamps (they differ between runs)."""
    spec = load_spec(spec_path)
    tables = PipelineTables(spec.lake, spec.name)
    volatile = {"run_id", "created_at", "updated_at", "rejected_at", "source_file"}
    out = {}
    for name, path in (("changelog", tables.changelog), ("aggregates", tables.aggregates),
                       ("partials", tables.partials), ("dead_letter", tables.dead_letter),
                       ("state", tables.stream_state)):
        df = DeltaTable(path).to_pandas()
        df = df[[c for c in df.columns if c not in volatile]]
        hashable = [c for c in df.columns if not c.endswith(("__counts",))]
        out[name] = df.sort_values(hashable).reset_index(drop=True)
    return out


@pytest.fixture(scope="module")
def reference(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, pd.DataFrame]:
    root = tmp_path_factory.mktemp("reference")
    spec_path = make_pipeline(root)
    land_files(root)
    assert len(restart(spark, spec_path).batches) == 4
    return snapshot(spec_path)


@pytest.mark.parametrize("failpoint", ["commit:changelog:after@2", "commit:state:before@3"])
def test_kill_9_mid_batch_then_restart_equals_an_uninterrupted_run(spark, tmp_path, reference, failpoint):
    spec_path = make_pipeline(tmp_path)
    land_files(tmp_path)
    crashed = stream_cli(spec_path, failpoint)
    assert crashed.returncode == KILLED, crashed.stderr[-3000:]
    restart(spark, spec_path)
    got = snapshot(spec_path)
    for name, want in reference.items():
        pd.testing.assert_frame_equal(got[name], want, check_dtype=False, obj=name)


def test_a_kill_after_spark_marked_a_handed_off_batch_done_replays_it_from_its_record(tmp_path, reference):
    """A batch that came to the driver returns to Spark before its commits: killed at its last one, Spark has
    marked it done, and only its hand-off record brings it back."""
    spec_path = make_pipeline(tmp_path)
    land_files(tmp_path)
    crashed = stream_cli(spec_path, "commit:state:before@2")  # batch 1's state commit, on the commit thread
    assert crashed.returncode == KILLED, crashed.stderr[-3000:]
    spec = load_spec(spec_path)
    checkpoint = Path(PipelineTables(spec.lake, spec.name).stream_checkpoint)
    assert (checkpoint / "commits" / "1").exists()  # Spark reads batch 1 never again
    assert [p.name for p in (checkpoint / "handoff").glob("*.json")] == ["1.json"]
    restarted = stream_cli(spec_path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "mini-batch 1 was handed off to its commits when the stream stopped" in restarted.stderr
    assert not list((checkpoint / "handoff").glob("*.json"))
    got = snapshot(spec_path)
    for name, want in reference.items():
        pd.testing.assert_frame_equal(got[name], want, check_dtype=False, obj=name)


def test_sigterm_stops_at_a_batch_boundary_and_a_restart_goes_on(spark, tmp_path):
    spec_path = make_pipeline(tmp_path)
    land_files(tmp_path, count=1)
    proc = subprocess.Popen(_argv(spec_path), cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    spec = load_spec(spec_path)
    state = PipelineTables(spec.lake, spec.name).stream_state
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if DeltaTable.is_deltatable(state) and DeltaTable(state).transaction_version("clicks.stream") == 0:
                break
            time.sleep(1)
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
        land_files(tmp_path, first=1, count=1)  # arrives while the stream runs
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "stopped by signal at a batch boundary" in out
    # every batch the stopped run started is complete; a restart processes only what is left
    land_files(tmp_path, first=2, count=2)
    restart(spark, spec_path)
    log = DeltaTable(PipelineTables(spec.lake, spec.name).changelog).to_pandas()
    assert sorted(set(log["batch_id"])) == [0, 1, 2, 3]
    assert set(DeltaTable(PipelineTables(spec.lake, spec.name).partials).to_pandas()["batch"]) == {
        f"stream-{i}" for i in range(4)}


def test_bad_spec_and_missing_landing_exit_non_zero_with_the_fix(tmp_path):
    spec_path = make_pipeline(tmp_path)
    done = stream_cli(spec_path)
    assert done.returncode == 3
    assert "landing directory" in done.stderr and "does not exist" in done.stderr
    raw = yaml.safe_load(spec_path.read_text())
    raw["stream"]["trigger"] = "soon"
    spec_path.write_text(yaml.safe_dump(raw))
    done = stream_cli(spec_path)
    assert done.returncode == 2 and "stream.trigger: bad duration 'soon'" in done.stderr
    shutil.rmtree(tmp_path)
