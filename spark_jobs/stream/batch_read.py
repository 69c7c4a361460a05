"""A mini-batch's one pass over its files: rows read and classified (late ones too: a row every window of which has
closed; a row counts in its open windows), pre-aggregated per (event day, key, stored window), each reject a group of
its own; a batch that fits the driver comes to it in that same job."""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.durations import utc
from spark_jobs.errors import InputError
from spark_jobs.jobs.landing import classify, read_landing
from spark_jobs.jobs.landing_files import Screen, spark_read_error
from spark_jobs.lake.layout import SPEC_VERSION
from spark_jobs.lake.spec_record import RecordedSpec
from spark_jobs.lake.table_rules import DAY
from spark_jobs.persisted import persisted
from spark_jobs.phases import CompiledAggregates, partial_aggregate
from spark_jobs.spark_failures import spark_errors
from spark_jobs.spark_functions import F
from spark_jobs.spec import PipelineSpec
from spark_jobs.stream.outputs import Rows

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["BatchRead", "BatchReader"]

log = logging.getLogger("spark_jobs")


class BatchReader:
    """Reads mini-batches; learns how many groups a row makes, to bring the next batches to the driver in the pass."""

    def __init__(self, spark: SparkSession, compiled: CompiledAggregates, record: RecordedSpec,
                 driver_max_keys: int) -> None:
        self.spark, self.compiled, self.record, self.driver_max_keys = spark, compiled, record, driver_max_keys
        self.spec = compiled.spec
        self._groups_per_row: float | None = None  # a batch's groups over its footers' bound: the largest seen

    def read(self, found: Screen, watermark: dt.datetime | None, batch_id: int) -> BatchRead:
        """The pass. A batch comes to the driver in that same Spark job when its files' footers bound it under the
        driver's limit, or when twice the groups per row of the densest batch yet would fit (before any batch, when
        its bound is within twice the limit: a pass lost to a batch that does not fit is at most that large); another
        is cached and counted first. A file unreadable past its footer fails here (InputError)."""
        combined = self._combined(found, watermark)
        bound = found.readable_rows()
        groups = None if bound is None else bound * self.spec.window.windows_per_row  # at most, per row and window
        most, density = self.driver_max_keys, self._groups_per_row
        fits = groups is not None and groups <= most
        expected = fits or (groups is not None
                            and (groups <= 2 * most if density is None else 2 * density * groups <= most))
        read = BatchRead(combined)
        try:
            if not (expected and read.collect(bounded=fits)):
                read.combined = persisted(combined)
                valid = F.col(_BAD).isNull()
                read.counted(read.combined.agg(
                    F.sum(F.when(valid, F.col("_rows"))).alias("rows"), F.count(F.when(~valid, 1)).alias("rejected"),
                    F.min(F.when(valid, F.col("_first_seen"))).alias("low"), F.count(F.when(valid, 1)).alias("keys"),
                    F.max(F.when(valid, F.col("max_event_time"))).alias("high"),
                    F.count(F.when(F.col("_reject._late"), 1)).alias("late")).first())
        except spark_errors() as exc:
            read.combined.unpersist()
            raise InputError(f"mini-batch {batch_id} failed reading {self.spec.source.path}: "
                             f"{spark_read_error(exc)}") from exc
        if groups:
            self._groups_per_row = max(self._groups_per_row or 0.0, (read.keys + read.rejected) / groups)
        return read

    def _combined(self, found: Screen, watermark: dt.datetime | None) -> DataFrame:
        """The batch's groups and rejects in one frame (see :func:`_rejects_apart`)."""
        spec, window = self.spec, self.spec.window
        et = F.col(spec.source.event_time)
        rows = classify(read_landing(self.spark, spec, found), spec, F.col(DAY), DAY)
        valid = F.col("_reason").isNull()
        rows = _before_cut(rows, spec, valid, F.lit(False) if watermark is None else window.may_be_late(et, watermark))
        rows = rows.withColumn("_late", F.lit(False)) if watermark is None else window.with_late(
            rows, event_time=spec.source.event_time, keys=spec.group_by, valid=valid, watermark=watermark)
        rows = rows.withColumn("_reason", F.coalesce("_reason", F.when(F.col("_late"), F.concat(
            F.lit("late: "), et.cast("string"), F.lit(
                f" is in no window still open at the watermark {watermark or dt.datetime.min:%Y-%m-%d %H:%M:%S} "
                "UTC; the batch combine of its day counts it")))))
        windowed = window.assign(_rejects_apart(rows.withColumn(DAY, F.col(DAY).cast("date")), spec),
                                 event_time=spec.source.event_time, keys=spec.group_by)
        windowed = windowed.withColumns({c: F.when(F.col(_BAD).isNull(), F.col(c)) for c in window.bounds})
        windowed = windowed if watermark is None else window.open_only(windowed, watermark)
        combined = partial_aggregate(windowed, self.compiled, extra_keys=[DAY, _BAD], extra_aggs={
            "max_event_time": F.max(et), "_first_seen": F.min(et),
            "_rows": window.count_once(spec.source.event_time), "_reject": F.first("_reject")})
        if self.record.uncovered_through is not None:  # days whose earlier rows a spec change dropped
            combined = combined.withColumn(SPEC_VERSION, F.when(F.col(DAY) <= F.lit(self.record.uncovered_through),
                                                                F.lit(0).cast("bigint")).otherwise(F.col(SPEC_VERSION)))
        return combined


_BAD = "_bad"
_REJECT = "struct<_reason string, _raw string, _file string, _late boolean>"  # Arrow needs nullable fields


def _before_cut(rows: DataFrame, spec: PipelineSpec, valid: Column, late: Column) -> DataFrame:
    """Before a cut for lateness: ``_raw`` and ``_file`` as one ``_record`` for the rows that are or may become rejects
    alone (the cut sorted every row's record and file name: a session batch's read took a third longer; Parquet's record
    is its typed columns, written out for those rows alone), and an invalid row in no group (keys rewritten after the
    cut took the aggregation a second exchange)."""
    raw = F.to_json(F.struct(*(c for c, _ in spec.source.schema))) if spec.source.format == "parquet" else F.col("_raw")
    rows = rows.withColumn("_record", F.when(~valid | late, F.struct(raw.alias("_raw"), F.col("_file"))))
    return rows.drop("_raw", "_file").withColumns({k: F.when(valid, F.col(k)) for k in spec.group_by})


def _rejects_apart(rows: DataFrame, spec: PipelineSpec) -> DataFrame:
    """Rejects ride through the pre-aggregation as groups of their own, so one pass over a batch's files yields both:
    ``_bad``, a grouping key, is a row id for a reject (NULL for a valid row), ``_reject`` its reason, record, file and
    lateness; its event time is the epoch and its keys NULL (a late row's are its own: ``_bad`` groups it alone)."""
    bad = F.col("_reason").isNotNull()
    reject = F.when(bad, F.struct("_reason", "_record._raw", "_record._file", "_late").cast(_REJECT))
    epoch = F.timestamp_seconds(F.lit(0))
    columns = [F.when(bad, epoch).otherwise(F.col(c)).alias(c) if c == spec.source.event_time else F.col(c)
               for c in rows.columns if c not in ("_reason", "_record", "_late")]
    return rows.select(*columns, F.when(bad, F.monotonically_increasing_id()).alias(_BAD), reject.alias("_reject"))


class BatchRead:
    """A mini-batch's files read once: its pre-aggregated groups and its rejects in one DataFrame (cached when
    it is not collected in the pass), their counts, and (batches that fit the driver) both on the driver as Arrow."""

    def __init__(self, combined: DataFrame) -> None:
        self.combined = combined
        self.rows = self.keys = self.rejected = self.late = 0
        self.low: dt.datetime | None = None  # event times of the valid rows
        self.high: dt.datetime | None = None
        self.collected: pa.Table | None = None  # the valid groups on the driver
        self._rejects: pa.Table | None = None

    def counted(self, counts: Any) -> None:
        self.rows, self.keys = int(counts["rows"] or 0), int(counts["keys"])
        self.rejected, self.late = int(counts["rejected"]), int(counts["late"])
        self.low, self.high = utc(counts["low"]), utc(counts["high"])

    def collect(self, *, bounded: bool = True) -> bool:
        """Bring the groups and rejects to the driver. An estimated batch (not ``bounded``) whose result outgrows
        ``spark.driver.maxResultSize`` is not collected (False): it is counted and merged in Spark instead."""
        try:
            table = self.combined.toArrow()
        except spark_errors() as exc:
            if bounded or "maxResultSize" not in str(exc):
                raise
            log.warning("a mini-batch held more groups than expected; merging it in Spark (%s)", exc)
            return False
        bad = pc.is_valid(table.column(_BAD))
        valid = table.filter(pc.invert(bad)).drop_columns([_BAD, "_reject"])
        rejects = pa.Table.from_struct_array(table.filter(bad).column("_reject").combine_chunks())
        self.collected, self._rejects = valid, rejects
        self.rows, self.keys = int(pc.sum(valid.column("_rows")).as_py() or 0), valid.num_rows
        self.rejected, self.late = rejects.num_rows, int(pc.sum(rejects.column("_late")).as_py() or 0)
        self.low = utc(pc.min(valid.column("_first_seen")).as_py())
        self.high = utc(pc.max(valid.column("max_event_time")).as_py())
        return True

    def groups(self) -> DataFrame:
        return self.combined.where(F.col(_BAD).isNull()).drop(_BAD, "_reject", "_rows")

    def rejects(self) -> Rows:
        return self._rejects if self._rejects is not None else (
            self.combined.where(F.col(_BAD).isNotNull()).select("_reject.*"))
