"""The DAG files import cleanly, wire the expected tasks, and parse without pyspark or GX."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.airflow.harness import ROOT
from tests.builders import make_spec

PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()},
       "pyspark": sorted(m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")),
       "gx": "great_expectations" in sys.modules, "dags": {}}
for dag in bag.dags.values():
    out["dags"][dag.dag_id] = {
        "tasks": {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks},
        "schedule": getattr(dag.timetable, "expression", None) or getattr(dag.timetable, "_expression", ""), "catchup": dag.catchup, "max_active_runs": dag.max_active_runs,
        "params": sorted(dag.params.keys()),
        "outlets": {t.task_id: [getattr(o, "uri", str(o)) for o in t.outlets] for t in dag.tasks if t.outlets},
        "modes": {t.task_id: t.mode for t in dag.tasks if hasattr(t, "mode")},
        "pools": {t.task_id: t.pool for t in dag.tasks if t.pool != "default_pool"},
    }
print("PROBE" + json.dumps(out))
"""


def parse(tmp_path: Path, pipelines: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({"AIRFLOW_HOME": str(tmp_path / "home"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"), "SPARK_JOBS_PIPELINES": str(pipelines)})
    proc = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "dags")], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE")), None)
    assert proc.returncode == 0 and line, proc.stderr[-4000:]
    return json.loads(line[len("PROBE"):])


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict:
    return parse(tmp_path_factory.mktemp("dagbag"), ROOT / "pipelines")


def test_every_dag_file_imports_without_errors(parsed):
    assert parsed["errors"] == {}
    assert set(parsed["dags"]) == {"page_views_batch", "page_views_stream", "lake_maintenance"}


def test_parsing_imports_neither_pyspark_nor_great_expectations(parsed):
    assert parsed["pyspark"] == []
    assert parsed["gx"] is False


def test_the_batch_dag_gates_combine_and_reduce_with_validations(parsed):
    dag = parsed["dags"]["page_views_batch"]
    assert dag["tasks"] == {
        "wait_for_landing": ["validate_input"],
        "validate_input": ["combine"],
        "combine": ["validate_partials"],
        "validate_partials": ["reduce"],
        "reduce": ["validate_outputs"],
        "validate_outputs": ["publish"],
        "publish": [],
    }
    assert dag["schedule"] == "0 0 * * *" and dag["max_active_runs"] == 2
    assert dag["params"] == ["date", "force_recombine"]
    assert dag["modes"]["wait_for_landing"] == "reschedule"
    assert dag["pools"] == {"reduce": "aggregates_page_views"}  # shared with the stream DAG's writers
    lake = (ROOT / "data" / "lake").resolve()
    assert dag["outlets"] == {"publish": [f"file://{lake}/page_views/aggregates"]}


def test_the_stream_and_maintenance_dags(parsed):
    stream = parsed["dags"]["page_views_stream"]
    assert stream["tasks"] == {"stream": ["reduce"], "reduce": ["validate_outputs"], "validate_outputs": []}
    assert stream["schedule"] == "*/5 * * * *" and stream["catchup"] is False and stream["max_active_runs"] == 1
    assert stream["pools"] == {"stream": "aggregates_page_views", "reduce": "aggregates_page_views"}
    assert parsed["dags"]["lake_maintenance"]["tasks"] == {"maintain_page_views": []}


def test_one_batch_and_one_stream_dag_per_spec(tmp_path):
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    make_spec(pipelines, name="clicks")
    make_spec(pipelines, name="orders")
    (pipelines / "orders.yaml").rename(pipelines / "orders.yml")  # both extensions are specs
    parsed = parse(tmp_path, pipelines)
    dags = parsed["dags"]
    assert parsed["errors"] == {}
    assert sorted(dags) == ["clicks_batch", "clicks_stream", "lake_maintenance", "orders_batch", "orders_stream"]
    assert sorted(dags["lake_maintenance"]["tasks"]) == ["maintain_clicks", "maintain_orders"]
    assert dags["orders_stream"]["pools"]["reduce"] == dags["orders_batch"]["pools"]["reduce"] == "aggregates_orders"


def test_a_broken_spec_is_an_import_error_naming_it_and_the_others_keep_their_dags(tmp_path):
    pipelines = tmp_path / "pipelines"
    pipelines.mkdir()
    make_spec(pipelines, name="clicks")
    make_spec(pipelines, name="orders")
    (pipelines / "typo.yaml").write_text("name: typo\nsource: {path: [unclosed\n")  # a YAML error
    (pipelines / "refused.yml").write_text((pipelines / "orders.yaml").read_text().replace("fn: count", "fn: cnt"))
    (pipelines / "twin.yaml").write_text((pipelines / "clicks.yaml").read_text())  # a name already taken
    parsed = parse(tmp_path, pipelines)
    assert sorted(parsed["dags"]) == ["clicks_batch", "clicks_stream", "lake_maintenance", "orders_batch",
                                      "orders_stream"]
    [(file, error)] = parsed["errors"].items()  # the check file's, not the factory's: its DAGs stay scheduled
    assert file.endswith("dags/pipeline_specs_check.py")
    assert f"BrokenPipelineSpecs: 3 of 5 pipeline specs in {pipelines} do not load" in error
    assert f"invalid pipeline spec {pipelines / 'typo.yaml'}:\n  - not valid YAML at line 3" in error
    assert f"invalid pipeline spec {pipelines / 'refused.yml'}:\n  - aggregates[0].fn: unknown function 'cnt'" in error
    assert f"invalid pipeline spec {pipelines / 'twin.yaml'}:\n  - name: 'clicks' is also the name of" in error
