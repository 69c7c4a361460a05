"""Read a landing partition and type its rows; every row comes out valid or with a reason.

Nothing is dropped: a row that cannot be parsed or typed, lacks its event time or a group
key, or has an event time outside its partition's date carries ``_reason`` and its
original record in ``_raw``; the job sends those rows to ``dead_letter``.
"""

from __future__ import annotations

import dataclasses
from functools import reduce
from operator import or_
from typing import TYPE_CHECKING

from spark_jobs.durations import Duration
from spark_jobs.errors import InputError, SchemaMismatchError
from spark_jobs.jobs.landing_files import Screen, screen, spark_read_error
from spark_jobs.lake import storage
from spark_jobs.lake.table_rules import DAY, partition_day
from spark_jobs.spark_failures import spark_errors
from spark_jobs.spark_functions import F
from spark_jobs.spec import OPS, PipelineSpec
from spark_jobs.windows.kind import floor_micros

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["CORRUPT", "classify", "read_landing", "read_one", "screen_partition", "spark_read_error", "with_raw"]

CORRUPT = "_corrupt_record"
_INTS = {"int", "smallint", "tinyint", "bigint", "string"}
_CASTABLE = {  # spec type -> Parquet/Spark types that convert to it without losing meaning
    "string": {"string"}, "int": _INTS, "bigint": _INTS, "float": {"float", "double", "int", "bigint", "string"},
    "double": {"float", "double", "int", "bigint", "decimal", "string"}, "boolean": {"boolean", "string"},
    "date": {"date", "timestamp", "string"}, "timestamp": {"timestamp", "timestamp_ntz", "date", "string"},
}


def screen_partition(spec: PipelineSpec, date: str) -> Screen:
    """One landing day's files, sorted into readable, unreadable and empty (no data page read)."""
    path = spec.source.partition_path(date)
    if not storage.is_dir(path):
        raise InputError(f"no landing partition {path}; check --date, or land the day's files there "
                         "(python -m spark_jobs generate writes sample data)")
    names = storage.list_dir(path)
    if not names:
        raise InputError(f"landing partition {path} has no data files; land the day's files first")
    found = screen(names, spec, exact=False)
    if not found.readable:
        what = "; ".join(b.describe() for b in found.bad) or f"{len(found.empty)} empty file(s)"
        raise InputError(f"landing partition {path} has no readable data file ({what}); land the day's files again")
    return found


def read_landing(spark: SparkSession, spec: PipelineSpec, found: Screen) -> DataFrame:
    """The raw rows of screened landing files (a day's, or a mini-batch's of any days), read one way for the batch
    and the stream: spec columns as read (untyped text for JSON and CSV), ``_raw``, ``_file``, and ``event_date``
    from each file's partition directory; a CSV file by its header's names, in its header's order."""
    files = found.readable
    if not files:
        return _no_rows(spark, spec)
    reader = spark.read.option("basePath", spec.source.path)
    # a date when every file's partition directory holds one: parsed once a file, not once a row
    day = "date" if all(partition_day(f.rsplit("/", 2)[-2]) for f in files) else "string"
    if spec.source.format == "parquet":
        read_types = ", ".join([*(f"`{c}` {t}" for c, t in found.types.items()), f"{DAY} {day}"])
        try:
            df = (reader.schema(read_types) if found.types else reader).parquet(*files)
        except spark_errors() as exc:
            raise InputError(f"cannot read landing files in {_where(files, spec)}: {spark_read_error(exc)}") from exc
        _check_parquet_schema(df, spec, _where(files, spec))
        return with_raw(df, spec, DAY)
    reader = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT)
    if spec.source.format == "json":
        return with_raw(reader.schema(_text_schema([c for c, _ in spec.source.schema], day)).json(files), spec, DAY)
    by_header: dict[tuple[str, ...], list[str]] = {}
    for path in files:
        by_header.setdefault(found.headers.get(path) or tuple(c for c, _ in spec.source.schema), []).append(path)
    frames = [with_raw(reader.schema(_text_schema(list(header), day)).option("header", True)
                       .option("enforceSchema", False).csv(group), spec, DAY) for header, group in by_header.items()]
    return reduce(lambda out, frame: out.unionByName(frame), frames)


def read_one(spark: SparkSession, spec: PipelineSpec, found: Screen, path: str) -> None:
    """Read every value of one screened file (an action over its raw records: no column is pruned), to find the
    file a batch's failed read failed on."""
    read_landing(spark, spec, dataclasses.replace(found, readable=[path])).agg(F.count("_raw")).first()


def _text_schema(columns: list[str], day: str) -> str:
    return ", ".join([*(f"`{c}` string" for c in columns), f"`{CORRUPT}` string", f"{DAY} {day}"])


def _no_rows(spark: SparkSession, spec: PipelineSpec) -> DataFrame:
    """What :func:`read_landing` gives for no readable file: no rows, the same columns."""
    text = spec.source.format != "parquet"  # read as untyped text, with the corrupt record
    columns = [f"`{c}` {'string' if text else t}" for c, t in spec.source.schema] + [f"`{CORRUPT}` string"] * text
    return spark.createDataFrame([], ", ".join([*columns, "_raw string", "_file string", f"{DAY} string"]))


def _where(files: list[str], spec: PipelineSpec) -> str:
    """The landing partition the files are in, or the landing directory when they span several."""
    parents = {f.rsplit("/", 1)[0] for f in files}
    return storage.local_path(parents.pop()) if len(parents) == 1 else spec.source.path


def with_raw(df: DataFrame, spec: PipelineSpec, *keep: str) -> DataFrame:
    """Spec columns as read, the original record as ``_raw`` and its file as ``_file`` (plus ``keep``)."""
    columns = [c for c, _ in spec.source.schema]
    file_col = F.col("_metadata.file_path").alias("_file")
    if spec.source.format == "parquet":
        return df.select(*columns, F.to_json(F.struct(*(c for c in df.columns if c not in keep))).alias("_raw"),
                         file_col, *keep)
    raw = F.coalesce(F.col(CORRUPT), F.to_json(F.struct(*columns)))
    return df.select(*columns, F.col(CORRUPT), raw.alias("_raw"), file_col, *keep)


def _check_parquet_schema(df: DataFrame, spec: PipelineSpec, path: str) -> None:
    found = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    missing = [c for c, _ in spec.source.schema if c not in found]
    if missing:
        raise SchemaMismatchError(f"landing partition {path} lacks columns {missing} that source.schema declares "
                                  f"(files have {sorted(found)}); fix the files or the spec's source.schema")
    wrong = [f"{col} is {found[col]}, spec says {typ}" for col, typ in spec.source.schema
             if found[col].split("(")[0] not in _CASTABLE[typ]]
    if wrong:
        raise SchemaMismatchError(f"landing partition {path} has column types that cannot be read as the spec's: "
                                  f"{'; '.join(wrong)}; fix the files or the spec's source.schema")


def classify(raw: DataFrame, spec: PipelineSpec, date: str | Column | None, *keep: str) -> DataFrame:
    """Typed spec columns plus ``_reason`` (NULL for valid rows), ``_raw``, ``_file`` and ``keep``. ``date`` is
    the landing partition's date (a literal, or a column when rows of many partitions arrive together, as in the
    stream); rows outside it are rejected."""
    corrupt = F.col(CORRUPT).isNotNull() if CORRUPT in raw.columns else F.lit(False)
    # (row fails, why): the message is built for failing rows only
    checks: list[tuple[Column, Column]] = [(corrupt, F.lit("malformed record"))]
    typed: list[Column] = []
    kinds = {f.name: f.dataType.simpleString() for f in raw.schema.fields}
    for col, typ in spec.source.schema:
        src = F.col(col)
        value = src if kinds[col] == typ else src.try_cast(typ)
        typed.append(value.alias(col))
        if kinds[col] != typ:
            checks.append((~corrupt & src.isNotNull() & value.isNull(),
                           F.concat(F.lit(f"{col}: cannot read "), src.cast("string"), F.lit(f" as {typ}"))))
    et = F.col(spec.source.event_time)
    ok = ~F.col("_corrupt")
    missing = [(ok & et.isNull(), F.lit(f"{spec.source.event_time} is missing"))]
    if spec.source.null_keys == "reject":
        missing += [(ok & F.col(k).isNull(), F.lit(f"group key {k} is missing")) for k in spec.group_by]
    op = spec.source.op_column
    if op is not None:
        missing.append((ok & (F.col(op).isNull() | ~F.col(op).isin(*OPS)), F.concat(
            F.lit(f"{op}: bad change kind "), F.coalesce(F.col(op), F.lit("NULL")), F.lit(f"; use {', '.join(OPS)}"))))
    if date is not None:
        day, one = (F.lit(date) if isinstance(date, str) else date).cast("date"), Duration(86400)
        # the event's UTC day (the session's zone) by arithmetic: to_date's zone lookup was a twentieth of a stream pass
        missing.append((et.isNotNull() & (floor_micros(F.unix_micros(et), one) != F.unix_date(day) * one.micros),
                        F.concat(F.lit(f"{spec.source.event_time} "), et.cast("string"),
                                 F.lit(" is outside partition event_date="), day.cast("string"))))
    # type reasons read the untyped columns, the others the typed ones: two selects
    staged = raw.select(*typed, corrupt.alias("_corrupt"), "_raw", "_file",
                        _reasons(checks).alias("_type_reason"), *keep)
    reason = _reasons([(F.col("_type_reason").isNotNull(), F.col("_type_reason")), *missing])
    return staged.select(*(c for c, _ in spec.source.schema), "_raw", "_file", reason.alias("_reason"), *keep)


def _reasons(checks: list[tuple[Column, Column]]) -> Column:
    """The failing checks' messages joined by '; ', or NULL when every check passes."""
    failed = reduce(or_, (c for c, _ in checks))
    return F.when(failed, F.concat_ws("; ", *(F.when(c, m) for c, m in checks)))
