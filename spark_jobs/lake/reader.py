"""Read Delta tables as Arrow, without Spark: the read surface for everything that is not a job.

The inspect views, the quality gates' run queries, the Airflow sensors and conditions, the DAGs'
``publish`` task and the benchmarks read the lake through this module (delta-rs and pyarrow, no
JVM); the jobs read and write through a :class:`spark_jobs.lake.Lake` backend. A
:class:`Snapshot` is one version of one table. Errors from delta-rs (no table, a version out of
range or vacuumed: :data:`READ_ERRORS`) pass through unchanged: the caller knows what to tell its user.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from spark_jobs.lake._types import AppTxn

__all__ = ["READ_ERRORS", "CommitChange", "Snapshot", "commit_time", "is_table", "open_table", "table_version"]

# What a read of a table raises when the table cannot be read: delta-rs's DeltaError family (no table, a
# version out of range or whose log was cleaned up, a corrupt log), OSError from the file system (a path
# that is a file, no permission, a data file gone) and pyarrow's ArrowException (a corrupt data file).
# Readers that tell their user what went wrong catch these and nothing else.
READ_ERRORS: tuple[type[Exception], ...] = (DeltaError, OSError, pa.ArrowException)


def is_table(path: str) -> bool:
    """A Delta table (a ``_delta_log``) is at ``path``."""
    return bool(DeltaTable.is_deltatable(path))


def open_table(path: str, version: int | None = None) -> Snapshot:
    """The table at ``path``, at ``version`` or its latest; raises delta-rs's error when there is none."""
    return Snapshot(path, DeltaTable(path, version=version))


def table_version(path: str) -> int | None:
    """The latest version of the table at ``path``; None when there is no Delta table there."""
    return open_table(path).version() if is_table(path) else None


def commit_time(entry: dict[str, Any]) -> dt.datetime:
    """When a commit (an entry of :meth:`Snapshot.history`) was made, in UTC."""
    return dt.datetime.fromtimestamp(int(entry.get("timestamp", 0)) / 1000, dt.UTC)


@dataclass(frozen=True)
class CommitChange:
    """What one commit did: the data files it added and removed and their rows, and the app transactions it
    recorded. A count is None when it cannot be told: the commit's log file is gone (log cleanup), a file's
    statistics hold no row count, or a removed file was added before the first commit asked about and the
    snapshot before that one can no longer be read."""

    version: int
    files_added: int | None = None
    files_removed: int | None = None
    rows_added: int | None = None
    rows_removed: int | None = None
    app_txns: tuple[AppTxn, ...] = ()


def _commit_log(path: str, version: int) -> list[dict[str, Any]] | None:
    """The actions (``add``, ``remove``, ``txn``, ``commitInfo`` ...) of the commit ``version`` of the local table
    at ``path``, as its JSON log file holds them; None when that file is gone (log cleanup) or not local.

    The one read of the raw log, because deltalake's API has no per-commit view of it: ``history()`` gives
    each commit's commit info only; a commit's added and removed files are otherwise the difference of the
    ``get_add_actions()`` of two snapshots, a ``load_as_version`` each (measured on a table of 400 commits:
    8 s, against 0.1 s to read their JSON files); and no call lists app transactions
    (``transaction_version(app_id)`` needs the app id, and gives its latest version at a snapshot, not whether
    this commit recorded it: every commit to a spec-shaped table records ``<pipeline>.spec`` again)."""
    log = Path(path) / "_delta_log" / f"{version:020d}.json"
    try:
        text = log.read_text()
    except OSError:
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _num_records(add: dict[str, Any]) -> int | None:
    """The row count in an add action's statistics, if they hold one."""
    try:
        return int(json.loads(add.get("stats") or "{}")["numRecords"])
    except (KeyError, TypeError, ValueError):
        return None


def _total(counts: list[int | None]) -> int | None:
    return None if any(n is None for n in counts) else sum(n for n in counts if n is not None)


def _change(version: int, actions: list[dict[str, Any]] | None, records: dict[str, int | None]) -> CommitChange:
    """One commit's change from its actions; ``records`` (each live file's rows) is brought up to date."""
    if actions is None:
        return CommitChange(version)
    added: list[int | None] = []
    removed: list[int | None] = []
    txns: list[AppTxn] = []
    for action in actions:
        if "add" in action:
            records[unquote(action["add"]["path"])] = n = _num_records(action["add"])
            added.append(n)
        elif "remove" in action:
            removed.append(records.pop(unquote(action["remove"]["path"]), None))
        elif "txn" in action:
            txns.append(AppTxn(str(action["txn"].get("appId")), int(action["txn"].get("version", -1))))
    return CommitChange(version, len(added), len(removed), _total(added), _total(removed), tuple(txns))


class Snapshot:
    """One version of a Delta table: metadata, log and rows, read through delta-rs and pyarrow."""

    def __init__(self, path: str, table: DeltaTable) -> None:
        self.path = path
        self._table = table

    def version(self) -> int:
        return int(self._table.version())

    def at(self, version: int) -> Snapshot:
        """Another version of the same table."""
        return open_table(self.path, version)

    # ------------------------------------------------------------------ metadata
    def schema(self) -> pa.Schema:
        """The columns as Arrow types."""
        return pa.schema(self._table.schema().to_arrow())

    @property
    def partition_columns(self) -> list[str]:
        return list(self._table.metadata().partition_columns)

    @property
    def reader_features(self) -> set[str]:
        """The protocol's reader features (``deletionVectors``, ``columnMapping`` ...) a reader must support."""
        return set(getattr(self._table.protocol(), "reader_features", None) or [])

    def add_actions(self) -> pa.Table:
        """One row per data file: ``path``, ``size_bytes``, ``num_records``, ``partition.<column>``,
        ``min.<column>``/``max.<column>`` statistics."""
        return pa.table(self._table.get_add_actions(flatten=True))

    def num_files(self) -> int:
        return len(self._table.file_uris())

    def transaction_version(self, app_id: str) -> int | None:
        """The input version the app transaction ``app_id`` recorded, if any."""
        return self._table.transaction_version(app_id)

    # ----------------------------------------------------------------------- log
    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Commit infos up to this version, newest first (``version``, ``timestamp``, ``operation``,
        and the custom metadata a job committed: ``run_id``, ``job``, ``batch`` ...)."""
        return list(self._table.history(limit))

    def version_at(self, when: dt.datetime) -> int | None:
        """The last version committed at or before ``when`` (aware); None when ``when`` is before the first."""
        before = [int(h["version"]) for h in self.history() if commit_time(h) <= when]
        return max(before) if before else None

    def commit_changes(self, first: int) -> list[CommitChange]:
        """What each commit from version ``first`` to this one did, oldest first (see :func:`_commit_log`). The
        rows of a removed file come from the statistics of the commit that added it, or of the snapshot before
        ``first``."""
        records: dict[str, int | None] = {}
        if first > 0:
            try:
                actions = self.at(first - 1).add_actions()
            except READ_ERRORS:  # its log was cleaned up: the rows of files removed later are not known
                actions = None
            if actions is not None:
                records = dict(zip((unquote(p) for p in actions["path"].to_pylist()),
                                   actions["num_records"].to_pylist(), strict=True))
        return [_change(v, _commit_log(self.path, v), records) for v in range(first, self.version() + 1)]

    # ---------------------------------------------------------------------- rows
    def read(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None) -> pa.Table:
        """The rows (``columns`` only, those matching ``filter``) as one Arrow table."""
        return self._dataset().to_table(columns=list(columns) if columns is not None else None, filter=filter)

    def head(self, n: int, columns: Sequence[str] | None = None, filter: pc.Expression | None = None) -> pa.Table:
        """The first ``n`` rows in file order; stops reading once it has them."""
        return self._dataset().head(n, columns=list(columns) if columns is not None else None, filter=filter)

    def _dataset(self) -> pads.Dataset:
        """The live files as a pyarrow dataset. delta-rs's own gives every file a guarantee built from its
        statistics, about a millisecond a file before a row is read (0.6-0.9 s for a stream's 700 files of
        ``aggregates``); a plain Parquet dataset of the same files prunes by their row groups' statistics as it
        scans. The plain one only where it reads the same rows: a local table without partition columns and
        without reader features (deletion vectors, column mapping)."""
        uris = self._table.file_uris()
        if self.partition_columns or self.reader_features or any("://" in u for u in uris):
            return self._table.to_pyarrow_dataset()
        return pads.dataset(uris, schema=self.schema(), format="parquet")
