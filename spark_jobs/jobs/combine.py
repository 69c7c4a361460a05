"""combine-group: pre-aggregate one day of landing data into partial accumulators.

Idempotent: the day's batch partials are replaced in one Delta commit, so running a day
twice (or backfilling it) gives the same table. Rejected rows go to ``dead_letter``,
replacing that day's earlier rejects, and ``runs`` records rows in = aggregated + rejected.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from contextlib import suppress
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.errors import InputError, UsageError
from spark_jobs.jobs.conflicts import retry_conflicts
from spark_jobs.jobs.landing import classify, read_landing, read_one, screen_partition, spark_read_error
from spark_jobs.jobs.landing_files import BadFile, Screen, file_columns, isolate_unreadable
from spark_jobs.jobs.run_record import RunRecord, recorded_run
from spark_jobs.lake import Commit, Lake, PipelineTables, open_lake
from spark_jobs.lake.layout import SPEC_VERSION
from spark_jobs.lake.spec_record import ensure_applied
from spark_jobs.lake.table_rules import BATCH, DEAD_LETTER_PARTITIONS, PARTIALS_PARTITIONS
from spark_jobs.persisted import persisted
from spark_jobs.phases.compiled import CompiledAggregates, partial_aggregate
from spark_jobs.spark_failures import spark_errors
from spark_jobs.spark_functions import F
from spark_jobs.spec import PipelineSpec
from spark_jobs.windows.kind import TS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["batch_columns", "combine", "parse_date", "run", "write_dead_letters"]

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def parse_date(text: str) -> str:
    """A strict YYYY-MM-DD date (Python also takes 20240301 and 2024-W09-5: not a landing partition's name)."""
    with suppress(ValueError):
        if isinstance(text, str) and _DATE.fullmatch(text):
            return dt.date.fromisoformat(text).isoformat()
    raise UsageError(f"bad date {str(text)[:40]!r}; use YYYY-MM-DD, e.g. 2024-03-01")


def batch_columns(partials: DataFrame, *, batch: str, source: str, event_date: Column, run_id: str) -> DataFrame:
    """Lay out partial rows as the ``partials`` table stores them."""
    return partials.select(F.lit(batch).alias("batch"), F.lit(source).alias("source"), event_date.alias("event_date"),
                           *(c for c in partials.columns if c not in ("event_date", SPEC_VERSION)),
                           F.lit(run_id).alias("run_id"), F.current_timestamp().alias("created_at"), SPEC_VERSION)


def combine(rows: DataFrame, spec: PipelineSpec, compiled: CompiledAggregates, *, date: str, run_id: str) -> DataFrame:
    """Pure transform: valid typed rows of one day -> that day's ``partials`` rows."""
    partials = partial_aggregate(spec.window.assign(rows, event_time=spec.source.event_time, keys=spec.group_by),
                                 compiled)
    return batch_columns(partials, batch=date, source=BATCH, event_date=F.lit(date).cast("date"), run_id=run_id)


def write_dead_letters(lake: Lake, tables: PipelineTables, rows: DataFrame | pa.Table, *, job: str, batch: str,
                       run_id: str, rejected: int, files: Sequence[BadFile] = ()) -> Commit | None:
    """Replace the rejects of (job, batch) with this run's rows and quarantined ``files``; no commit when
    both are empty. ``rows``: rows with ``_reason`` (NULL for valid ones), ``_raw`` and ``_file``; a few
    rejects already on the driver come as an Arrow table and commit without a Spark job."""
    path = tables.dead_letter
    partition = {"job": job, "batch": batch}
    if rejected == 0 and not files and not any(f.partition_values == partition for f in lake.files(path)):
        return None
    bad: DataFrame | pa.Table
    if isinstance(rows, pa.Table):
        bad = _dead_letter_rows(rows, files, run_id=run_id, job=job, batch=batch)
    else:
        rejects = rows.where(F.col("_reason").isNotNull()).select("_reason", "_raw", "_file")
        if files:
            columns = file_columns(files)
            rejects = rejects.unionByName(rows.sparkSession.createDataFrame(
                list(zip(*columns.values(), strict=True)), ", ".join(f"{c} string" for c in columns)))
        bad = rejects.select(
            F.lit(run_id).alias("run_id"), F.col("_reason").alias("reason"), F.col("_raw").alias("raw"),
            F.col("_file").alias("source_file"), F.current_timestamp().alias("rejected_at"),
            F.lit(job).alias("job"), F.lit(batch).alias("batch"),
        )
    return lake.replace_partition(bad, path, partition_by=DEAD_LETTER_PARTITIONS, partition=partition,
                                  metadata={"run_id": run_id, "job": job, "batch": batch})


def _dead_letter_rows(rows: pa.Table, files: Sequence[BadFile], *, run_id: str, job: str, batch: str) -> pa.Table:
    """``dead_letter`` rows, as the Spark path writes them, of rejects held in Arrow."""
    text = pa.schema([(c, pa.string()) for c in ("_reason", "_raw", "_file")])
    rejects = pa.concat_tables([rows.filter(pc.is_valid(rows.column("_reason"))).select(text.names).cast(text),
                                pa.table(file_columns(files), schema=text)])
    n = rejects.num_rows
    return pa.table({
        "run_id": pa.repeat(pa.scalar(run_id), n), "reason": rejects.column("_reason"),
        "raw": rejects.column("_raw"), "source_file": rejects.column("_file"),
        "rejected_at": pa.repeat(pa.scalar(dt.datetime.now(dt.UTC), TS), n),
        "job": pa.repeat(pa.scalar(job), n), "batch": pa.repeat(pa.scalar(batch), n)})


def run(spark: SparkSession, spec: PipelineSpec, date: str, *, lake: Lake | None = None,
        run_id: str | None = None) -> RunRecord:
    """Combine one landing day into ``partials`` (replacing that day's batch partials). A file Spark fails on
    anyway is found by reading the day's files one at a time, then left out or named (``source.on_bad_file``)."""
    date = parse_date(date)
    lake = lake or open_lake(spark)
    tables = PipelineTables(spec.lake, spec.name)
    compiled = CompiledAggregates(spec, ensure_applied(lake, spec, run_id=run_id or ""))
    with recorded_run(lake, tables, job="combine", batch=date, run_id=run_id) as record:
        record.inputs = [spec.source.partition_path(date)]
        found = screen_partition(spec, date)
        found.check(spec, f"combine of {date}")
        try:
            _combine(spark, spec, compiled, lake, tables, record, date, found)
        except _Unreadable as failed:
            culprits = isolate_unreadable(found.readable, lambda f: read_one(spark, spec, found, f))
            if not culprits or len(culprits) == len(found.readable):
                raise InputError(str(failed)) from failed.__cause__
            found.drop(culprits)
            found.check(spec, f"combine of {date}")
            _combine(spark, spec, compiled, lake, tables, record, date, found)
        record.files_quarantined, record.files_skipped = len(found.bad), len(found.empty)
    return record


class _Unreadable(InputError):
    """Spark failed reading the day's files: one of them may be unreadable past its footer."""


def _combine(spark: SparkSession, spec: PipelineSpec, compiled: CompiledAggregates, lake: Lake,
             tables: PipelineTables, record: RunRecord, date: str, found: Screen) -> None:
    source = spec.source.partition_path(date)
    # one pass over the input: typed rows are cached, counted, aggregated and rejected from it
    rows = persisted(classify(read_landing(spark, spec, found), spec, date))
    try:
        valid = rows.where(F.col("_reason").isNull()).drop("_raw", "_reason", "_file")
        partials = combine(valid, spec, compiled, date=date, run_id=record.run_id)
        metadata = {"run_id": record.run_id, "job": "combine", "batch": date, "inputs": [source]}

        def commit(attempt: int) -> None:  # the day's rows do not depend on the tables: only the commits rerun
            record.attempts = attempt
            record.versions_read = {"partials": lake.version(tables.partials)}
            written = {"partials": lake.replace_partition(
                partials, tables.partials, partition_by=PARTIALS_PARTITIONS,
                partition={"event_date": date, "source": BATCH}, metadata=metadata).version}
            dead = write_dead_letters(lake, tables, rows, job="combine", batch=date, run_id=record.run_id,
                                      rejected=record.rows_rejected, files=found.bad)
            if dead is not None:
                written["dead_letter"] = dead.version
            record.versions_written = written

        try:
            counts = rows.agg(F.count(F.lit(1)).alias("n"), F.count("_reason").alias("rejected")).first()
        except spark_errors() as exc:
            raise _Unreadable(f"combine of {date} failed reading {source}: {spark_read_error(exc)}") from exc
        assert counts is not None
        record.rows_in, record.rows_rejected = int(counts["n"]), int(counts["rejected"])
        record.rows_aggregated = record.rows_in - record.rows_rejected  # each row is one or the other
        try:
            retry_conflicts(commit, what=f"combine of {date}", recheck=lambda: ensure_applied(lake, spec))
        except spark_errors() as exc:
            raise InputError(f"combine of {date} failed reading {source}: {spark_read_error(exc)}") from exc
    finally:
        rows.unpersist()
