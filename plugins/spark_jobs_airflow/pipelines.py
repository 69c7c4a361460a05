"""The pipelines a deployment runs: every spec (``*.yaml``, ``*.yml``) in one folder, and their pools. One place
decides which specs load, for the DAG factory (a broken spec loses only its own DAGs) and for ``python -m
spark_jobs_airflow.pipelines FOLDER``, the deployment step that creates each pipeline's pool (docker compose's init
runs it). Loading a spec is pure Python: no pyspark, no Great Expectations."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from spark_jobs.errors import SpecError
from spark_jobs.spec import PipelineSpec, load_spec, spec_files, specs_folder

__all__ = ["BrokenPipelineSpecs", "aggregates_pool", "create_pools", "load_specs", "specs_folder"]

class BrokenPipelineSpecs(Exception):
    """Specs in the folder that do not load, each with its file and message (``dags/pipeline_specs_check.py``)."""


def aggregates_pool(pipeline: str) -> str:
    """The one-slot Airflow pool the writers of ``<pipeline>.aggregates`` share (create it before the DAGs run)."""
    return f"aggregates_{pipeline}"


def load_specs(folder: Path) -> tuple[list[PipelineSpec], list[str]]:
    """The specs in ``folder`` that load, and the message of each one that does not (bad YAML, a field the jobs
    would refuse, a name an earlier file took)."""
    specs: list[PipelineSpec] = []
    broken: list[str] = []
    for path in spec_files(folder):
        try:
            spec = load_spec(path)
        except SpecError as exc:
            broken.append(str(exc))
            continue
        if (taken := next((s for s in specs if s.name == spec.name), None)) is not None:
            broken.append(f"invalid pipeline spec {path}:\n  - name: {spec.name!r} is also the name of {taken.origin}; "
                          "give each pipeline its own name")
            continue
        specs.append(spec)
    return specs, broken


def create_pools(specs: Sequence[PipelineSpec], airflow: str = "airflow", env: Mapping[str, str] | None = None
                 ) -> list[str]:
    """``airflow pools set`` each pipeline's pool: idempotent, so a deployment can run it on every start.
    Without its pool Airflow never schedules a pipeline's reduce or stream task."""
    for spec in specs:
        subprocess.run([airflow, "pools", "set", aggregates_pool(spec.name), "1", f"writers of {spec.name}.aggregates"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300, env=env)
    return [aggregates_pool(spec.name) for spec in specs]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python -m spark_jobs_airflow.pipelines FOLDER  (the folder of the pipeline specs, "
              "$SPARK_JOBS_PIPELINES): creates each pipeline's Airflow pool", file=sys.stderr)
        return 2
    specs, broken = load_specs(Path(args[0]))
    for message in broken:  # it has no DAGs either: Airflow's import errors list it
        print(f"skipped: {message}", file=sys.stderr)
    try:
        pools = create_pools(specs)
    except (OSError, subprocess.SubprocessError) as exc:  # no airflow on PATH, no migrated database, ...
        detail = getattr(exc, "stderr", None) or exc
        print(f"error: `airflow pools set` failed: {str(detail).strip()[-2000:]}; run this where the Airflow CLI "
              "reaches the metadata database (after `airflow db migrate`)", file=sys.stderr)
        return 1
    for pool in pools:
        print(f"pool {pool}: 1 slot")
    return 0


if __name__ == "__main__":
    sys.exit(main())
