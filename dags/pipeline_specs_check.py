"""Airflow import errors for the pipeline specs that do not load; this DAG file defines no DAG. Airflow keeps one
import error per DAG file and stops scheduling every DAG of a file that has one. So ``pipelines_dag_factory.py``
builds the DAGs of the specs that load and leaves the broken ones out, and this file fails to import while any spec
is broken, naming each one's file and the spec's message: the UI's import errors banner and ``airflow dags
list-import-errors`` show it, and no other pipeline stops. With every spec valid it imports cleanly."""

from __future__ import annotations

from spark_jobs_airflow import BrokenPipelineSpecs, load_specs, specs_folder

FOLDER = specs_folder()
SPECS, BROKEN = load_specs(FOLDER)
if BROKEN:
    raise BrokenPipelineSpecs(
        f"{len(BROKEN)} of {len(BROKEN) + len(SPECS)} pipeline specs in {FOLDER} do not load; their DAGs are not "
        "built, the other pipelines run (`python -m spark_jobs plan --pipeline SPEC` checks a spec):\n"
        + "\n".join(BROKEN))
