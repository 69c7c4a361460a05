"""The spec a lake was built with, recorded in the lake (the Delta table ``<lake>/<pipeline>/specs``), so
``inspect`` needs no spec file and ``plan`` compares a new spec with it. One row per step of a spec version:
``applying`` when ``apply`` starts changing the tables, ``applied`` when they match it (the first job records a
lake's first spec ``applied``). Each row holds the normalised spec (without paths: they belong to the machine,
not the pipeline), and what serving needs to know of the lake's history:

- ``coverage``: per aggregate, the spec version from which rows hold its accumulator (its ``since``); a
  row whose ``spec_version`` is older lacks it: the aggregate is NULL there until the day is recombined.
- ``layout_since`` / ``uncovered_through``: the last change that needed every day from raw data (a key
  added, a window refined) and the last event day whose partials it dropped. The stream's rows of such a
  day count as no version (0) until a batch combine of the day supersedes them.

Jobs call :func:`ensure_applied` before they write: a spec that differs from the record, or an apply
that has not finished, is refused (exit 2) before any work. Every commit to a table shaped by the spec
also carries the app transaction ``<pipeline>.spec`` (its version), so ``apply`` and a job that started
before it conflict instead of writing a table with two layouts.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError
from deltalake.transaction import CommitProperties, Transaction

from spark_jobs._failpoints import failpoint
from spark_jobs.errors import ConflictError, LakeError, SpecChangedError
from spark_jobs.lake._types import GUARD_PREFIX, AppTxn
from spark_jobs.lake.layout import ADOPTED
from spark_jobs.lake.tables import PipelineTables
from spark_jobs.spec import Duration, PipelineSpec, parse_spec

if TYPE_CHECKING:
    from spark_jobs.lake import Lake

__all__ = ["APPLIED", "APPLYING", "RECORD_SCHEMA", "RecordedSpec", "applied_record", "current", "ensure_applied",
           "first_record", "fingerprint", "has_data", "normalise", "read_records", "spec_app_id", "table_spec_version",
           "write_record"]

Status = Literal["applying", "applied"]
APPLYING: Status = "applying"
APPLIED: Status = "applied"
FORMAT = 1  # of the ``spec`` column: a lake recorded by a newer format is refused, not misread

RECORD_SCHEMA = pa.schema([
    ("version", pa.int64()), ("status", pa.string()), ("spec", pa.string()), ("fingerprint", pa.string()),
    ("coverage", pa.string()), ("layout_since", pa.int64()), ("uncovered_through", pa.date32()),
    ("changes", pa.string()), ("recorded_at", pa.timestamp("us", tz="UTC")), ("run_id", pa.string()),
    ("format", pa.int64()),
])
_RECORD_GUARD = f"{GUARD_PREFIX}specs"  # two racing records conflict: the later one re-reads


def spec_app_id(pipeline: str) -> str:
    """The app transaction on every spec-shaped table: the spec version its rows follow."""
    return f"{pipeline}.spec"


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Duration) else value


def normalise(spec: PipelineSpec) -> dict[str, Any]:
    """The spec as the lake records it: every field that shapes the tables or the jobs, in the YAML's
    shape (so :func:`parse_spec` reads it back), without paths."""
    # fields at their default are left out: a setting added later leaves the lakes recorded before it alone
    source = {f.name: _plain(getattr(spec.source, f.name)) for f in dataclasses.fields(spec.source)
              if f.name != "path" and getattr(spec.source, f.name) not in (None, f.default)}
    source["schema"] = dict(spec.source.schema)
    out: dict[str, Any] = {
        "name": spec.name, "source": source, "group_by": list(spec.group_by),
        "aggregates": [{"name": a.name, "fn": a.fn, "columns": list(a.columns), "args": dict(a.args)}
                       for a in spec.aggregates],
        "stream": {f.name: _plain(getattr(spec.stream, f.name)) for f in dataclasses.fields(spec.stream)}}
    if (window := spec.window.to_dict()) is not None:
        out["window"] = window
    if spec.rollups:
        out["rollups"] = [{"name": r.name, "grain": str(r.grain), "by": list(r.by)} for r in spec.rollups]
    return out


def fingerprint(normalised: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(normalised, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RecordedSpec:
    """One row of ``specs``: a spec version of the lake and where its rows stand."""

    version: int
    status: Status
    spec: dict[str, Any]
    coverage: dict[str, int]
    layout_since: int = 1
    uncovered_through: dt.date | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)
    recorded_at: dt.datetime | None = None
    run_id: str = ""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.spec)

    @property
    def applied(self) -> bool:
        return self.status == APPLIED

    def since(self, aggregate: str) -> int:
        """The first spec version whose rows hold ``aggregate``'s accumulator."""
        return self.coverage.get(aggregate, self.version)

    def pipeline_spec(self, *, lake: str, source_path: str | None = None) -> PipelineSpec:
        """The recorded spec as a :class:`PipelineSpec` of this lake (the landing path from the given
        one, else a placeholder: a spec from the lake alone serves reads, not jobs)."""
        raw = {**self.spec, "lake": lake, "source": {**self.spec["source"], "path": source_path or f"{lake}/_landing"}}
        return parse_spec(raw, origin=f"{lake}/{self.spec['name']}/specs (version {self.version})")

    def row(self) -> dict[str, Any]:
        return {"version": self.version, "status": self.status, "spec": json.dumps(self.spec, sort_keys=True),
                "fingerprint": self.fingerprint, "coverage": json.dumps(self.coverage, sort_keys=True),
                "layout_since": self.layout_since, "uncovered_through": self.uncovered_through,
                "changes": json.dumps(self.changes, default=str), "run_id": self.run_id, "format": FORMAT,
                "recorded_at": self.recorded_at or dt.datetime.now(dt.UTC)}


def first_record(spec: PipelineSpec, *, run_id: str, status: Status = APPLIED,
                 changes: list[dict[str, Any]] | None = None) -> RecordedSpec:
    """Version 1: every aggregate covered from the start."""
    return RecordedSpec(version=ADOPTED, status=status, spec=normalise(spec),
                        coverage={a.name: ADOPTED for a in spec.aggregates}, layout_since=ADOPTED,
                        changes=changes or [], run_id=run_id)


def read_records(lake: str, pipeline: str) -> list[RecordedSpec]:
    """Every recorded step, oldest first; none for a lake that records no spec."""
    path = PipelineTables(lake, pipeline).specs
    if not DeltaTable.is_deltatable(path):
        return []
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    out = []
    for r in sorted(rows, key=lambda r: (r["version"], r["status"] == APPLIED, r["recorded_at"])):
        if (r.get("format") or 1) > FORMAT:
            raise LakeError(f"the spec record {path} was written by a newer spark_jobs (format {r['format']}); "
                            "upgrade spark_jobs to run this lake")
        coverage = {k: int(v) for k, v in json.loads(r["coverage"]).items()}
        out.append(RecordedSpec(int(r["version"]), r["status"], json.loads(r["spec"]), coverage,
                                int(r["layout_since"] or ADOPTED), r["uncovered_through"],
                                json.loads(r["changes"] or "[]"), r["recorded_at"], r["run_id"] or ""))
    return out


def current(lake: str, pipeline: str) -> RecordedSpec | None:
    """The lake's latest spec step: applied, or an apply under way (or cut off)."""
    return records[-1] if (records := read_records(lake, pipeline)) else None


def write_record(lake: str, pipeline: str, record: RecordedSpec) -> None:
    """Append one step; a concurrent record makes this one fail with :class:`ConflictError` (re-read)."""
    path = PipelineTables(lake, pipeline).specs
    table = pa.Table.from_pylist([record.row()], schema=RECORD_SCHEMA)
    props = CommitProperties(app_transactions=[Transaction(_RECORD_GUARD, record.version)],
                             custom_metadata={"run_id": record.run_id, "job": "spec", "status": record.status})
    failpoint("commit:specs:before")
    try:
        write_deltalake(path, table, mode="append", commit_properties=props)
    except DeltaError as exc:  # a concurrent first record (the table was created meanwhile) or a lost commit
        raise ConflictError(f"recording spec version {record.version} in {path} lost to a concurrent writer: "
                            f"{exc}") from exc
    failpoint("commit:specs:after")


def has_data(lake: str, pipeline: str) -> bool:
    """Whether the pipeline's spec-shaped tables hold anything (a lake from before spec records has them)."""
    t = PipelineTables(lake, pipeline)
    return any(DeltaTable.is_deltatable(p) for p in (t.partials, t.aggregates, t.stream_state))


def table_spec_version(path: str, pipeline: str) -> int | None:
    """The spec version a table's layout follows (its ``<pipeline>.spec`` app transaction)."""
    return DeltaTable(path).transaction_version(spec_app_id(pipeline)) if DeltaTable.is_deltatable(path) else None


def ensure_applied(lake: Lake, spec: PipelineSpec, *, run_id: str = "") -> RecordedSpec:
    """:func:`applied_record`, and ``lake`` bound to that version: its commits to spec-shaped tables carry
    ``<pipeline>.spec``, so a change applied meanwhile makes them conflict instead of mixing layouts."""
    record = applied_record(spec, run_id=run_id)
    lake.spec_txn = AppTxn(spec_app_id(spec.name), record.version)
    return record


def applied_record(spec: PipelineSpec, *, run_id: str = "") -> RecordedSpec:
    """The lake's spec, when ``spec`` is it (recorded as version 1 on a new lake). SpecChangedError when it differs,
    an apply is not finished, or the lake has tables but records no spec (written before spec records)."""
    root = spec.lake
    for _ in range(3):
        if (record := current(root, spec.name)) is None:
            if has_data(root, spec.name):
                raise SpecChangedError(
                    f"the lake {root}/{spec.name} was written before lakes recorded their spec; adopt its spec "
                    f"once with `python -m spark_jobs apply --pipeline {spec.origin}` (the spec the tables were "
                    "written with), then run the job again")
            with suppress(ConflictError):  # another job recorded it first: compare with theirs
                write_record(root, spec.name, first_record(spec, run_id=run_id))
            continue
        if not record.applied:
            raise SpecChangedError(f"an apply to spec version {record.version} of {spec.name} has not finished (the "
                                   "lake's tables may be half changed); run `python -m spark_jobs apply --pipeline "
                                   "SPEC` with that spec again to finish it, then run the job")
        if record.fingerprint != fingerprint(given := normalise(spec)):
            differ = ", ".join(k for k in sorted(set(record.spec) | set(given))
                               if json.dumps(record.spec.get(k), sort_keys=True)
                               != json.dumps(given.get(k), sort_keys=True))
            raise SpecChangedError(
                f"pipeline spec {spec.origin} differs from the spec the lake {root}/{spec.name} records (version "
                f"{record.version}) in: {differ}; the job would write tables of two layouts, so it stopped. See "
                f"the changes with `python -m spark_jobs plan --pipeline {spec.origin}`, make them with "
                f"`python -m spark_jobs apply --pipeline {spec.origin}`")
        return record
    raise ConflictError(f"could not record the spec of {spec.name} in {PipelineTables(root, spec.name).specs}: "
                        "other writers keep recording theirs; run the job again")
