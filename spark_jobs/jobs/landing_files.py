"""Landing files that cannot be read, found before their rows are counted: a file counts all or nothing.

An interrupted upload, a text file named ``.parquet`` or a column of another type would otherwise fail Spark's read
of the whole batch, and the stream, whose next batch is that file again, could never get past it. Each file is
screened on the driver (size; Parquet footer and column types; CSV header), and a read that fails anyway is narrowed
down to its file by reading the files one at a time. ``source.on_bad_file`` says what follows: ``quarantine``
(default) records the file in ``dead_letter`` and goes on without it; ``fail`` stops the job naming the files. A
zero-byte file has no rows: it is skipped and counted (``runs.files_skipped``), never quarantined.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from spark_jobs.errors import InputError
from spark_jobs.lake import storage
from spark_jobs.spark_failures import spark_errors
from spark_jobs.spec import PipelineSpec

__all__ = ["BadFile", "Screen", "file_columns", "isolate_unreadable", "screen", "spark_read_error"]

QUARANTINED = "file quarantined"

_ARROW_TO_SPARK = {"int8": "tinyint", "int16": "smallint", "int32": "int", "int64": "bigint", "float": "float",
                   "double": "double", "string": "string", "large_string": "string", "bool": "boolean",
                   "date32": "date", "timestamp": "timestamp"}
_SPARK_TYPES = {*_ARROW_TO_SPARK.values(), "decimal"}


def spark_type(arrow_type: str) -> str:
    """The Spark SQL type of a Parquet column's Arrow type name (``decimal128(10, 2)`` -> ``decimal(10,2)``)."""
    if arrow_type.startswith("decimal"):
        return "decimal" + arrow_type[arrow_type.index("("):].replace(" ", "") if "(" in arrow_type else "decimal"
    return _ARROW_TO_SPARK.get(arrow_type, arrow_type)


# Parquet (Arrow) type -> the spec types Spark reads it as, for a read with the spec's schema (the stream):
# the type itself and the widenings Spark's Parquet reader makes
_READS_AS = {
    "int8": {"int", "bigint", "double"}, "int16": {"int", "bigint", "double"}, "int32": {"int", "bigint", "double"},
    "int64": {"bigint"}, "float": {"float", "double"}, "double": {"double"}, "string": {"string"},
    "large_string": {"string"}, "bool": {"boolean"}, "date32": {"date", "timestamp"}, "timestamp": {"timestamp"},
}


@dataclass(frozen=True)
class BadFile:
    path: str
    size: int
    reason: str

    def describe(self) -> str:
        return f"{self.path} ({self.size:,} bytes): {self.reason}"


@dataclass
class Screen:
    """A batch's files sorted into the ones to read, the unreadable ones and the empty ones."""

    readable: list[str] = field(default_factory=list)
    bad: list[BadFile] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)  # Parquet: the Spark type to read each column as
    rows: dict[str, int] = field(default_factory=dict)  # Parquet: each file's row count, from its footer
    headers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # CSV: each file's columns, from its header

    def readable_rows(self) -> int | None:
        """The readable files' rows, when their footers tell (Parquet): an upper bound before any is read."""
        return None if any(p not in self.rows for p in self.readable) else sum(self.rows[p] for p in self.readable)

    def check(self, spec: PipelineSpec, what: str) -> None:
        """With ``on_bad_file: fail``, stop before anything is written, naming every bad file."""
        if self.bad and spec.source.on_bad_file == "fail":
            raise InputError(f"{what}: {len(self.bad)} landing file(s) cannot be read (source.on_bad_file: fail): "
                             + "; ".join(b.describe() for b in self.bad)
                             + "; fix or remove the files, or set source.on_bad_file: quarantine")

    def drop(self, bad: Sequence[BadFile]) -> None:
        gone = {b.path for b in bad}
        self.readable = [p for p in self.readable if p not in gone]
        self.bad.extend(bad)


def _screen_footer(path: str, size: int, out: Screen, footers: dict[str, dict[str, str]]) -> None:
    """A Parquet file's column types (Arrow names, every timestamp's ``timestamp``) and row count from its footer,
    or the file is unreadable."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with storage.open_input(path) as handle, pq.ParquetFile(handle) as file:
            schema, rows = file.schema_arrow, file.metadata.num_rows
    except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError: an interrupted upload, or not Parquet
        out.bad.append(BadFile(path, size, f"not a readable Parquet file ({str(exc).splitlines()[0][:200]})"))
        return
    out.rows[path] = rows
    footers[path] = {f.name: "timestamp" if pa.types.is_timestamp(f.type) else str(f.type) for f in schema}


def screen(paths: Sequence[str], spec: PipelineSpec, *, exact: bool = True) -> Screen:
    """Sort ``paths`` before any is read (no data page): empty, unreadable or readable. A Parquet file is
    unreadable when its footer is not there or a column's type cannot be read as the spec's. ``exact=False`` (a
    day's combine) also takes a column that every file of the day holds as one type that casts to the spec's, e.g.
    a day landed as strings: its values are cast, and rejected, row by row (``Screen.types``: each column's)."""
    out = Screen()
    footers: dict[str, dict[str, str]] = {}
    for path in paths:
        size = storage.size(path)
        if size == 0:
            out.empty.append(path)
        elif size < 0:
            out.bad.append(BadFile(path, size, "cannot be opened"))
        elif spec.source.format == "csv":
            _screen_csv(path, size, spec, out)
        elif spec.source.format != "parquet":
            out.readable.append(path)  # text: a line that does not parse is a rejected row, with its reason
        else:
            _screen_footer(path, size, out, footers)
    if spec.source.format != "parquet":
        return out
    columns = spec.source.columns  # and after them the others, which a rejected row's raw record keeps
    for col in [*columns, *sorted({c for types in footers.values() for c in types} - set(columns))]:
        held = {types[col] for types in footers.values() if col in types}
        if len(held) == 1 and (not exact or col not in columns):  # one type for the whole day: read as it, cast
            out.types[col] = spark_type(next(iter(held)))  # row by row (or, when it does not cast, refused)
        elif held and col in columns:
            out.types[col] = columns[col]
    if any(t.split("(")[0] not in _SPARK_TYPES for t in out.types.values()):
        out.types = {}  # a nested type: read with the files' own schema, which the job then refuses
    for path, types in footers.items():
        wrong = [f"column {col} holds {types[col]}, the spec reads {want}" for col, want in spec.source.schema
                 if col in types and out.types.get(col) == want and want not in _READS_AS.get(types[col], ())]
        if wrong:
            out.bad.append(BadFile(path, storage.size(path), "; ".join(wrong) + "; fix the file or source.schema"))
        else:
            out.readable.append(path)
    out.readable.sort()
    return out


def _screen_csv(path: str, size: int, spec: PipelineSpec, out: Screen) -> None:
    """A CSV file is read by its header's names, in its header's order: one lacking a spec column is unreadable."""
    try:
        header = tuple(c.strip() for c in next(csv.reader([storage.first_line(path)]), []))
    except OSError as exc:
        out.bad.append(BadFile(path, size, f"cannot be opened ({exc})"))
        return
    missing = [c for c, _ in spec.source.schema if c not in header]
    if missing:
        out.bad.append(BadFile(path, size, f"its header lacks columns {missing} (header: {list(header)}); fix the "
                                           "file or the spec's source.schema"))
    else:
        out.headers[path] = header
        out.readable.append(path)


def isolate_unreadable(paths: Sequence[str], read_one: Callable[[str], object]) -> list[BadFile]:
    """After Spark failed reading a batch: the files that fail read alone (``read_one`` runs an action over one)."""
    bad = []
    for path in paths:
        try:
            read_one(path)
        except spark_errors() as exc:
            bad.append(BadFile(path, storage.size(path), f"cannot be read: {spark_read_error(exc)}"))
    return bad


def file_columns(bad: Sequence[BadFile]) -> dict[str, list[str]]:
    """The quarantined files as ``dead_letter`` rejects, one row per file (``_raw``: its path and size)."""
    return {"_reason": [f"{QUARANTINED}: {b.reason}" for b in bad],
            "_raw": [json.dumps({"path": b.path, "size": b.size}) for b in bad], "_file": [b.path for b in bad]}


def spark_read_error(exc: BaseException) -> str:
    """Spark's own reason for a failure (and its cause), without the JVM stack or py4j wrapper."""
    found: list[str] = []
    for line in (raw.strip() for raw in str(exc).splitlines()):
        if not line or line.startswith(("at ", "...", "JVM stacktrace", "Traceback", "An error occurred while")):
            continue
        line = line.removeprefix("Caused by:").strip()
        if ("Exception" in line.split(":")[0] or "Error" in line.split(":")[0]) and ":" in line:
            line = line.split(":", 1)[1].strip()
        if line and line not in found:
            found.append(line)
        if len(found) == 2:
            break
    return "; caused by: ".join(found)[:800] or str(exc)[:800]
