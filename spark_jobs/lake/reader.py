"""Read Delta tables as Arrow, without Spark (delta-rs and pyarrow, no JVM): the read surface for everything
that is not a job (inspect, quality gates' run queries, sensors, the DAGs' ``publish``, benchmarks). Errors
(:data:`READ_ERRORS`) pass through unchanged: the caller knows what to tell its user.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from spark_jobs.lake import storage
from spark_jobs.lake._types import AppTxn

__all__ = ["READ_ERRORS", "CommitChange", "CommitFiles", "FileSpan", "Snapshot", "commit_files", "commit_time",
           "commit_with_txn", "is_table", "open_table", "read_plain", "table_version"]

# What reading an unreadable table raises: delta-rs's DeltaError (no table, a version out of range or cleaned up,
# a corrupt log), OSError (the file system) and ArrowException (a corrupt data file). Callers catch only these.
READ_ERRORS: tuple[type[Exception], ...] = (DeltaError, OSError, pa.ArrowException)


def is_table(path: str) -> bool:
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
    """What one commit did: data files added and removed, their rows, the app transactions it recorded. A count
    is None when it cannot be told: the commit's log file is cleaned up, a file's statistics hold no row count,
    or a removed file predates the first commit asked about and the snapshot before it can no longer be read."""

    version: int
    files_added: int | None = None
    files_removed: int | None = None
    rows_added: int | None = None
    rows_removed: int | None = None
    app_txns: tuple[AppTxn, ...] = ()


def _commit_log(path: str, version: int) -> list[dict[str, Any]] | None:
    """The actions of commit ``version`` as its JSON log file holds them; None when that file is gone or not local.
    The one raw read of the log, as deltalake has no per-commit view: ``history()`` holds commit infos only, a
    commit's files are the difference of two snapshots' ``get_add_actions()`` at 80 times the cost (400 commits:
    8 s against 0.1 s), and no call lists a commit's app transactions (``transaction_version``: an app's latest)."""
    try:
        text = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text()
    except OSError:
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@dataclass(frozen=True)
class CommitFiles:
    """One commit's data files added and removed (relative paths), and its commit info (``operation``, ``job`` ...)."""

    version: int
    info: dict[str, Any]
    added: tuple[str, ...]
    removed: tuple[str, ...]


def commit_files(path: str, version: int) -> CommitFiles | None:
    """What commit ``version`` of the table at ``path`` added and removed; None when its log file is gone."""
    if (actions := _commit_log(path, version)) is None:
        return None
    info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    files = {kind: tuple(unquote(a[kind]["path"]) for a in actions if kind in a) for kind in ("add", "remove")}
    return CommitFiles(version, info, files["add"], files["remove"])


def commit_with_txn(path: str, txn: AppTxn, *, newest: int) -> int | None:
    """The version of the commit, from ``newest`` back to the first, that recorded the app transaction ``txn``."""
    for version in range(newest, -1, -1):
        if any((t := a.get("txn")) and t.get("appId") == txn.app_id and int(t.get("version", -1)) == txn.version
               for a in _commit_log(path, version) or []):
            return version
    return None


def _num_records(add: dict[str, Any]) -> int | None:
    try:
        return int(json.loads(add.get("stats") or "{}")["numRecords"])
    except (KeyError, TypeError, ValueError):
        return None


def _change(version: int, actions: list[dict[str, Any]], records: dict[str, int | None]) -> CommitChange:
    """One commit's change from its actions; ``records`` (each live file's rows) is brought up to date."""
    added: list[int | None] = []
    removed: list[int | None] = []
    txns = []
    for action in actions:
        if add := action.get("add"):
            records[unquote(add["path"])] = n = _num_records(add)
            added.append(n)
        elif remove := action.get("remove"):
            removed.append(records.pop(unquote(remove["path"]), None))
        elif txn := action.get("txn"):
            txns.append(AppTxn(str(txn.get("appId")), int(txn.get("version", -1))))
    rows = [None if None in ns else sum(n for n in ns if n is not None) for ns in (added, removed)]
    return CommitChange(version, len(added), len(removed), rows[0], rows[1], tuple(txns))


class Snapshot:
    """One version of a Delta table: metadata, log and rows, read through delta-rs and pyarrow."""

    def __init__(self, path: str, table: DeltaTable) -> None:
        self.path, self._table = path, table

    def version(self) -> int:
        return int(self._table.version())

    def at(self, version: int) -> Snapshot:
        return open_table(self.path, version)

    def schema(self) -> pa.Schema:
        return pa.schema(self._table.schema().to_arrow())

    @property
    def partition_columns(self) -> list[str]:
        return list(self._table.metadata().partition_columns)

    @property
    def reader_features(self) -> set[str]:
        """The protocol's reader features (``deletionVectors``, ``columnMapping`` ...) a reader must support."""
        return set(getattr(self._table.protocol(), "reader_features", None) or [])

    def add_actions(self) -> pa.Table:
        """A row per data file: ``path``, ``size_bytes``, ``num_records``, ``partition.<c>``, ``min.<c>``/``max.<c>``"""
        return pa.table(self._table.get_add_actions(flatten=True))

    def num_files(self) -> int:
        return len(self._table.file_uris())

    def transaction_version(self, app_id: str) -> int | None:
        return self._table.transaction_version(app_id)

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Commit infos, newest first: ``version``, ``timestamp``, ``operation``, a job's ``run_id``, ``job`` ..."""
        return list(self._table.history(limit))

    def version_at(self, when: dt.datetime) -> int | None:
        """The last version committed at or before ``when`` (aware); None when ``when`` is before the first."""
        return max((int(h["version"]) for h in self.history() if commit_time(h) <= when), default=None)

    def commit_changes(self, first: int) -> list[CommitChange]:
        """What each commit from version ``first`` to this one did, oldest first (see :func:`_commit_log`); the
        rows of a removed file come from the commit that added it, or from the snapshot before ``first``."""
        records: dict[str, int | None] = {}
        with suppress(*READ_ERRORS):  # its log was cleaned up: the rows of files removed later are not known
            if first > 0:
                files = self.at(first - 1).add_actions()
                records = dict(zip(map(unquote, files["path"].to_pylist()), files["num_records"].to_pylist(),
                                   strict=True))
        logs = ((v, _commit_log(self.path, v)) for v in range(first, self.version() + 1))
        return [CommitChange(v) if log is None else _change(v, log, records) for v, log in logs]

    def read_files(self, files: Sequence[str], columns: Sequence[str], extra: Sequence[pa.Field] = (),
                   filter: pc.Expression | None = None) -> pa.Table:
        """The rows of data files of this table (live or not: a removed file's rows until it is vacuumed), as its
        schema now has them (a column added since reads NULL) and with ``extra`` columns it no longer has (a dropped
        key's); for a table without partition columns."""
        return read_plain(self.uris(files), pa.schema([*self.schema(), *extra]), columns, filter)

    def uris(self, files: Sequence[str]) -> list[str]:
        """Where the data files (paths relative to the table, as its log names them) are."""
        return [str(Path(self.path) / f) for f in files]

    def read(self, columns: Sequence[str] | None = None, filter: pc.Expression | None = None) -> pa.Table:
        return self._dataset().to_table(columns=None if columns is None else list(columns), filter=filter)

    def head(self, n: int, columns: Sequence[str] | None = None, filter: pc.Expression | None = None) -> pa.Table:
        """The first ``n`` rows in file order; stops reading once it has them."""
        return self._dataset().head(n, columns=None if columns is None else list(columns), filter=filter)

    def spans(self, column: str, files: Sequence[str] | None = None) -> list[FileSpan] | None:
        """Data files (``files``, live or not; else the live ones) with their size and the range of ``column`` their
        statistics give (the log's for live files, the Parquet footers' for others: a removed file's log entry has
        none), for a reader that must not touch delta-rs (a forked worker: :func:`read_plain`); None when pyarrow
        alone does not read the table's rows (:meth:`_plain`)."""
        if not self._plain(self._table.file_uris()):
            return None
        if files is not None:
            return [_footer_span(uri, column) for uri in self.uris(files)]
        actions = self.add_actions()
        lows, highs = (actions.column(f"{b}.{column}").to_pylist() if f"{b}.{column}" in actions.column_names
                       else [None] * actions.num_rows for b in ("min", "max"))
        return [FileSpan(uri, size, lo, hi) for uri, size, lo, hi in zip(
            self.uris([unquote(p) for p in actions.column("path").to_pylist()]),
            actions.column("size_bytes").to_pylist(), lows, highs, strict=True)]

    def _plain(self, uris: Sequence[str]) -> bool:
        """Whether a plain Parquet dataset of the files (``uris``, the live ones) reads the same rows: a local table
        without partition columns and without reader features."""
        return not (self.partition_columns or self.reader_features or any("://" in u for u in uris))

    def _dataset(self) -> pads.Dataset:
        """The live files as a pyarrow dataset. delta-rs's own builds a guarantee from every file's statistics,
        about a millisecond a file before a row is read (0.6-0.9 s for a stream's 700 files of ``aggregates``);
        a plain Parquet dataset prunes by row-group statistics as it scans. The plain one where it reads the same
        rows (:meth:`_plain`)."""
        if not self._plain(uris := self._table.file_uris()):
            return self._table.to_pyarrow_dataset()
        return pads.dataset(uris, schema=self.schema(), format="parquet")


class FileSpan(NamedTuple):
    """A data file and the range of one column its statistics give (None: not every row group has them)."""

    uri: str
    size: int
    low: Any
    high: Any


def read_plain(uris: Sequence[str], schema: pa.Schema, columns: Sequence[str],
               filter: pc.Expression | None = None) -> pa.Table:
    """Rows of data files :meth:`Snapshot.spans` named, as ``schema``, with pyarrow alone (a forked worker's
    read: delta-rs's runtime panics in a forked process)."""
    return pads.dataset(list(uris), schema=schema, format="parquet").to_table(columns=list(columns), filter=filter)


def _footer_span(uri: str, column: str) -> FileSpan:
    """The range of ``column`` in a Parquet file's row-group statistics (None unless every row group has it)."""
    meta = pq.read_metadata(uri)
    at = [i for i in range(meta.num_columns) if meta.num_row_groups and meta.row_group(0).column(i).path_in_schema == column]
    stats = [meta.row_group(g).column(at[0]).statistics for g in range(meta.num_row_groups)] if at else []
    known = [s for s in stats if s is not None and s.has_min_max]
    whole = bool(known) and len(known) == len(stats)
    return FileSpan(uri, storage.size(uri), min(s.min for s in known) if whole else None,
                    max(s.max for s in known) if whole else None)
