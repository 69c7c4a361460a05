"""combine-group: pre-aggregate one day of landing data into partial accumulators.

Idempotent: the day's batch partials are replaced in one Delta commit, so running a day
twice (or backfilling it) gives the same table. Rejected rows go to ``dead_letter``,
replacing that day's earlier rejects, and ``runs`` records rows in = aggregated + rejected.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import TYPE_CHECKING

from spark_jobs.errors import InputError, PipelineError, UsageError
from spark_jobs.jobs.conflicts import retry_conflicts
from spark_jobs.jobs.landing import classify, read_partition, spark_read_error
from spark_jobs.jobs.runs import RunRecord, recorded_run
from spark_jobs.lake import Commit, Lake, PipelineTables, open_lake
from spark_jobs.lake.layout import SPEC_VERSION
from spark_jobs.lake.rules import BATCH, DEAD_LETTER_PARTITIONS, PARTIALS_PARTITIONS
from spark_jobs.lake.spec_record import ensure_applied
from spark_jobs.plan.phases import CompiledAggregates, assign_windows, partial_aggregate
from spark_jobs.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["batch_columns", "combine", "parse_date", "run", "write_dead_letters"]

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def parse_date(text: str) -> str:
    """A strict YYYY-MM-DD date (Python also takes 20240301 and 2024-W09-5: not a landing partition's name)."""
    try:
        if isinstance(text, str) and _DATE.fullmatch(text):
            return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        pass
    raise UsageError(f"bad date {str(text)[:40]!r}; use YYYY-MM-DD, e.g. 2024-03-01")


def batch_columns(partials: DataFrame, *, batch: str, source: str, event_date: Column, run_id: str) -> DataFrame:
    """Lay out partial rows as the ``partials`` table stores them."""
    from pyspark.sql import functions as F

    return partials.select(
        F.lit(batch).alias("batch"), F.lit(source).alias("source"), event_date.alias("event_date"),
        *(c for c in partials.columns if c not in ("event_date", SPEC_VERSION)), F.lit(run_id).alias("run_id"),
        F.current_timestamp().alias("created_at"), SPEC_VERSION,
    )


def combine(rows: DataFrame, spec: PipelineSpec, compiled: CompiledAggregates, *, date: str,
            run_id: str) -> DataFrame:
    """Pure transform: valid typed rows of one day -> that day's ``partials`` rows."""
    from pyspark.sql import functions as F

    partials = partial_aggregate(assign_windows(rows, spec), compiled)
    return batch_columns(partials, batch=date, source=BATCH, event_date=F.lit(date).cast("date"), run_id=run_id)


def write_dead_letters(lake: Lake, tables: PipelineTables, rows: DataFrame, *, job: str, batch: str,
                       run_id: str, rejected: int) -> Commit | None:
    """Replace the rejects of (job, batch) with this run's; no commit when both are empty."""
    from pyspark.sql import functions as F

    path = tables.dead_letter
    partition = {"job": job, "batch": batch}
    if rejected == 0 and not any(f.partition_values == partition for f in lake.files(path)):
        return None
    bad = rows.where(F.col("_reason").isNotNull()).select(
        F.lit(run_id).alias("run_id"), F.col("_reason").alias("reason"), F.col("_raw").alias("raw"),
        F.col("_file").alias("source_file"), F.current_timestamp().alias("rejected_at"),
        F.lit(job).alias("job"), F.lit(batch).alias("batch"),
    )
    return lake.replace_partition(bad, path, partition_by=DEAD_LETTER_PARTITIONS, partition=partition,
                                  metadata={"run_id": run_id, "job": job, "batch": batch})


def run(spark: SparkSession, spec: PipelineSpec, date: str, *, lake: Lake | None = None,
        run_id: str | None = None) -> RunRecord:
    """Combine one landing day into ``partials`` (replacing that day's batch partials)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    date = parse_date(date)
    lake = lake or open_lake(spark)
    tables = PipelineTables(spec.lake, spec.name)
    compiled = CompiledAggregates(spec, ensure_applied(lake, spec, run_id=run_id or ""))
    with recorded_run(lake, tables, job="combine", batch=date, run_id=run_id) as record:
        source = spec.source.partition_path(date)
        record.inputs = [source]
        # one pass over the input: typed rows are cached, counted, aggregated and rejected from it
        rows = classify(read_partition(spark, spec, date), spec, date).persist(StorageLevel.MEMORY_AND_DISK)
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
                                          rejected=record.rows_rejected)
                if dead is not None:
                    written["dead_letter"] = dead.version
                record.versions_written = written

            try:
                counts = rows.agg(F.count(F.lit(1)).alias("n"), F.count("_reason").alias("rejected")).first()
                assert counts is not None
                record.rows_in, record.rows_rejected = int(counts["n"]), int(counts["rejected"])
                record.rows_aggregated = record.rows_in - record.rows_rejected  # each row is one or the other
                retry_conflicts(commit, what=f"combine of {date}", recheck=lambda: ensure_applied(lake, spec))
            except PipelineError:
                raise
            except Exception as exc:
                raise InputError(f"combine of {date} failed reading {source}: {spark_read_error(exc)}") from exc
        finally:
            rows.unpersist()
    return record
