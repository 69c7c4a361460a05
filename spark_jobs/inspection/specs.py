"""Pipeline specs by name, from the specs folder the DAGs are built from. The web view serves a lake, not a spec; a
view that needs a pipeline's definition (the rollup: which aggregate each accumulator column holds, the window) finds
the spec by the pipeline's name among ``*.yaml``/``*.yml`` in ``$SPARK_JOBS_PIPELINES`` (default: the repo's
``pipelines/``), the folder ``dags/pipelines_dag_factory.py`` reads."""

from __future__ import annotations

from pathlib import Path

import yaml

from spark_jobs.errors import InspectError, SpecError
from spark_jobs.lake.spec_record import RecordedSpec, current
from spark_jobs.spec import SPECS_ENV, PipelineSpec, load_spec, spec_files, specs_folder

__all__ = ["SPECS_ENV", "find_spec", "lake_spec", "specs_folder"]


def find_spec(pipeline: str, folder: Path | None = None) -> PipelineSpec:
    """The validated spec named ``pipeline`` in ``folder`` (default :func:`specs_folder`); InspectError for no such
    folder, no valid spec of that name, or two. A file is fully validated only when its ``name`` is ``pipeline``;
    files that cannot be read or validated are skipped, and named in the error when no spec matches."""
    where = folder or specs_folder()
    hint = f"set ${SPECS_ENV} to the folder of the pipeline specs (default: the repo's pipelines/)"
    if not where.is_dir():
        raise InspectError(f"no pipeline specs folder {where}; {hint}")
    matches: list[PipelineSpec] = []
    skipped: list[str] = []
    others: list[str] = []
    for path in spec_files(where):
        try:
            raw = yaml.safe_load(path.read_text())
        except OSError as exc:
            skipped.append(f"{path.name} (unreadable: {exc.strerror})")
            continue
        except yaml.YAMLError:
            skipped.append(f"{path.name} (not valid YAML)")
            continue
        name = raw.get("name") if isinstance(raw, dict) else None
        if name != pipeline:
            if isinstance(name, str):
                others.append(name)
            else:
                skipped.append(f"{path.name} (no name)")
            continue
        try:
            matches.append(load_spec(path))
        except SpecError as exc:
            more = f" and {len(exc.problems) - 1} more problems" if len(exc.problems) > 1 else ""
            skipped.append(f"{path.name} (invalid: {exc.problems[0] if exc.problems else exc}{more})")
    if len(matches) > 1:
        raise InspectError(f"{len(matches)} specs in {where} are named {pipeline!r}: "
                           f"{', '.join(Path(s.origin).name for s in matches)}; keep one")
    if matches:
        return matches[0]
    skips = f"; skipped: {', '.join(skipped)}" if skipped else ""
    raise InspectError(f"no pipeline spec named {pipeline!r} in {where} (specs there: "
                       f"{', '.join(sorted(set(others))) or 'none'}{skips}); {hint}")


def lake_spec(lake: str, pipeline: str) -> tuple[PipelineSpec, RecordedSpec]:
    """The spec the lake records for ``pipeline`` (its latest applied version), with that record; InspectError when
    it records none (no such pipeline, or a lake written before spec records)."""
    record = current(lake, pipeline)
    if record is None:
        known = sorted(p.name for p in Path(lake).iterdir() if (p / "specs").is_dir()) if Path(lake).is_dir() else []
        raise InspectError(f"the lake {lake} records no spec for {pipeline!r} (pipelines that record one: "
                           f"{', '.join(known) or 'none'}); pass --pipeline SPEC (the YAML file), or adopt the spec "
                           f"with `python -m spark_jobs apply --pipeline SPEC`")
    try:
        return record.pipeline_spec(lake=lake), record
    except SpecError as exc:
        raise InspectError(f"the spec {lake}/{pipeline} records cannot be read here: {exc}") from exc
