"""Lake maintenance through delta-rs (no Spark): compact small files, vacuum with a safe retention, checkpoint. What
it does to each table of a pipeline:

- **compact** (``optimize.compact``): small files of a partition are rewritten into fewer, in one commit whose actions
  carry ``dataChange=false``. ``partials``, ``dead_letter``, ``runs`` and ``changelog`` are compacted. ``aggregates``
  is not: reduce keeps it clustered by window and skips files by their window statistics, and a compaction would undo
  that. Compacting ``partials`` is safe for reduce: its next run sees the old files removed and the new ones added,
  re-merges the keys they hold from the current files (the same rows, once), and its result is unchanged
  (``tests/airflow/test_maintenance.py`` checks this).
- **vacuum**: files removed longer than ``retention_hours`` ago (default 168, Delta's default; never below it unless
  ``enforce_retention=False``) are deleted. Time travel to versions older than the retention stops working; reduce,
  finding replaced partial files vacuumed, falls back to a full merge (correct, slower). The stream's state table
  (``_stream/state``), rewritten by every mini-batch, is vacuumed and checkpointed too, as are the declared rollup
  tables (``rollup_<name>``: clustered by bucket like ``aggregates``, so not compacted).
- **checkpoint**: a Parquet checkpoint of the log, so readers replay fewer JSON commits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_jobs.errors import LakeError
from spark_jobs.lake.tables import TABLES, PipelineTables, TableName, is_table_name

__all__ = ["COMPACTED", "DEFAULT_RETENTION_HOURS", "TableMaintenance", "maintain"]

log = logging.getLogger("spark_jobs")

DEFAULT_RETENTION_HOURS = 168
COMPACTED: tuple[TableName, ...] = ("partials", "dead_letter", "runs", "changelog")


@dataclass
class TableMaintenance:
    table: str
    path: str
    version_before: int
    version_after: int
    files_before: int
    files_after: int
    compacted: dict[str, Any] = field(default_factory=dict)
    vacuumed: list[str] = field(default_factory=list)
    checkpoint: bool = False

    def summary(self) -> str:
        removed = self.compacted.get("numFilesRemoved", 0)
        added = self.compacted.get("numFilesAdded", 0)
        what = f"compacted {removed} files into {added}" if self.compacted else "not compacted"
        return (f"{self.table}: {what}, {self.files_before} -> {self.files_after} files, vacuumed "
                f"{len(self.vacuumed)} files, version {self.version_before} -> {self.version_after}"
                f"{', checkpoint written' if self.checkpoint else ''}")


def maintain(lake: str, pipeline: str, *, retention_hours: int = DEFAULT_RETENTION_HOURS, dry_run: bool = False,
             enforce_retention: bool = True) -> list[TableMaintenance]:
    """Compact, vacuum and checkpoint every existing table of ``pipeline``; ``dry_run`` changes nothing."""
    from deltalake import CommitProperties, DeltaTable
    from deltalake.exceptions import DeltaError

    if retention_hours < 0:
        raise LakeError(f"--retention-hours must be >= 0, got {retention_hours}")
    if enforce_retention and retention_hours < DEFAULT_RETENTION_HOURS:
        raise LakeError(f"--retention-hours {retention_hours} is below the safe minimum of "
                        f"{DEFAULT_RETENTION_HOURS} hours: readers and reduce may still need those files; "
                        "pass a larger value (or, knowing no job is running, disable enforcement)")
    tables = PipelineTables(lake, pipeline)
    out: list[TableMaintenance] = []
    root = Path(tables.path("runs")).parent
    rollups = sorted(p.name for p in root.iterdir() if is_table_name(p.name) and p.name not in TABLES) \
        if root.is_dir() else []
    for name, path in [*((n, tables.path(n)) for n in (*TABLES, *rollups)), ("stream_state", tables.stream_state)]:
        if not DeltaTable.is_deltatable(path):
            continue
        try:
            dt = DeltaTable(path)
            entry = TableMaintenance(name, path, dt.version(), dt.version(), len(dt.file_uris()), len(dt.file_uris()))
            if name in COMPACTED and not dry_run:
                props = CommitProperties(custom_metadata={"job": "maintain"})
                entry.compacted = dt.optimize.compact(commit_properties=props)
                dt = DeltaTable(path)
            entry.vacuumed = dt.vacuum(retention_hours=retention_hours, dry_run=dry_run,
                                       enforce_retention_duration=enforce_retention)
            if not dry_run:
                dt = DeltaTable(path)
                dt.create_checkpoint()
                entry.checkpoint = True
            entry.version_after, entry.files_after = dt.version(), len(dt.file_uris())
        except (DeltaError, OSError) as exc:  # a concurrent commit, a retention delta-rs refuses, the file system
            raise LakeError(f"maintenance of {path} failed: {exc}; the table is unchanged past its last commit, "
                            "rerun when no job writes it") from exc
        log.info("%s", entry.summary())
        out.append(entry)
    if not out:
        raise LakeError(f"no Delta tables under {lake.rstrip('/')}/{pipeline}; run the pipeline first or pass the "
                        "right --lake")
    return out
