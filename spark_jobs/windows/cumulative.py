"""Cumulative windows, Flink's ``CUMULATE(step, size)``: in each bucket of ``size`` from the epoch, the windows
``[bucket start, bucket start + k·step)`` for k = 1..size/step (a day's first hour, its first two hours, ... the day).

Built as slices: ``partials`` and the stream's state hold each ``step``-sized slice once (an event is in one slice), and
a served window merges the slices from its bucket's start to its end. A slice is served in the windows that end at or
after it; a change of a slice reaches every window of its bucket; a slice stays in the stream's state until its
bucket's last window closes. Rollups merge the complete windows (one a bucket)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from spark_jobs.durations import Duration
from spark_jobs.key_match import join_on_keys, key_mask
from spark_jobs.windows.kind import EPOCH, TS, F, epoch_micros, floor_micros, floor_ticks, ticks, vs_watermark
from spark_jobs.windows.tumbling import TiledWindows

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["Cumulative"]

_BUCKET = "_bucket"


@dataclass(frozen=True)
class Cumulative(TiledWindows):
    step: Duration
    unit = "slice"
    rows_once = False
    serves_stored = False

    @property
    def grid(self) -> Duration:
        return self.step

    @property
    def windows(self) -> int:
        """Windows a bucket holds."""
        return self.size.seconds // self.step.seconds

    def to_dict(self) -> dict[str, str]:
        return {"size": str(self.size), "step": str(self.step)}

    def __str__(self) -> str:
        return f"{self.size} cumulating every {self.step}"

    def fits(self, start: dt.datetime, end: dt.datetime) -> bool:
        span = (end - start).total_seconds()
        return 0 < span <= self.size.seconds and span % self.step.seconds == 0

    def starts_between(self, lo: dt.datetime, hi: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
        size = dt.timedelta(seconds=self.size.seconds)
        return EPOCH + (lo - EPOCH) // size * size, hi  # from the start of lo's bucket

    def explain(self, phase: str) -> str | None:
        return {"combine": f"cumulative windows: events in {self.step} slices; the slices are stored",
                "reduce": f"each window [bucket start, bucket start + k * {self.step}) of a {self.size} bucket "
                          "merges its bucket's slices up to its end (a slice is in every window ending after it)",
                "stream": "the state keeps each slice until its bucket's last window closes; a batch's slices "
                          "re-derive every window of their buckets"}[phase]

    # ------------------------------------------------------------------ Spark forms
    def serve(self, rows: DataFrame, keys: Sequence[str]) -> DataFrame:
        """Each slice in every window of its bucket that ends at or after it."""
        first = ((F.unix_micros(F.col("window_end")) - F.col(_BUCKET)) / F.lit(self.step.micros)).cast("long")
        k = F.explode(F.sequence(first, F.lit(self.windows).cast("long")))
        return (self._bucketed(rows).withColumn("_k", k)
                .withColumns({"window_start": F.timestamp_micros(F.col(_BUCKET)),
                              "window_end": F.timestamp_micros(F.col(_BUCKET) + F.col("_k") * self.step.micros)})
                .drop(_BUCKET, "_k"))

    def is_open(self, watermark: dt.datetime) -> Column:
        bucket_end = floor_micros(F.unix_micros(F.col("window_start")), self.size) + F.lit(self.size.micros)
        return vs_watermark(bucket_end, ">", watermark)

    def open_only(self, rows: DataFrame, watermark: dt.datetime) -> DataFrame:
        """A slice whose windows up to its end have closed moves to the first open slice of its bucket, so that it
        counts in the open windows only (Flink's CUMULATE merges a late row into the first unfired window's slice)."""
        at = epoch_micros(watermark) // self.step.micros * self.step.micros
        closed = vs_watermark(F.unix_micros(F.col("window_end")), "<=", watermark)
        return rows.withColumns({"window_start": F.when(closed, F.timestamp_micros(F.lit(at))).otherwise(
            F.col("window_start")), "window_end": F.when(closed, F.timestamp_micros(F.lit(at + self.step.micros)))
            .otherwise(F.col("window_end"))})

    def touched(self, changed: DataFrame, keys: Sequence[str]) -> DataFrame:
        """Every window of the buckets a change holds a slice of: those its bucket's first slice is served in."""
        bucket = F.col(_BUCKET)
        first = self._bucketed(changed).select(*keys, F.timestamp_micros(bucket).alias("window_start"),
                                               F.timestamp_micros(bucket + self.step.micros).alias("window_end"))
        return self.serve(first.distinct(), keys)

    def within(self, stored: DataFrame, changed: DataFrame, keys: Sequence[str], *, anti: bool = False) -> DataFrame:
        """The slices of the buckets the changed slices are in (``anti``: of the other buckets)."""
        scope = self._bucketed(changed).select(*keys, _BUCKET).distinct()
        return join_on_keys(self._bucketed(stored), scope, [*keys, _BUCKET], "left_anti" if anti else "left_semi").drop(_BUCKET)

    def _bucketed(self, rows: DataFrame) -> DataFrame:
        return rows.withColumn(_BUCKET, floor_micros(F.unix_micros(F.col("window_start")), self.size))

    # ------------------------------------------------------------------ Arrow and driver forms
    def serve_arrow(self, rows: pa.Table, keys: Sequence[str]) -> pa.Table:
        bucket = floor_ticks(ticks(rows.column("window_start")), self.size)
        first = (ticks(rows.column("window_end")) - bucket) // self.step.micros
        counts = self.windows - first + 1
        at = np.repeat(np.arange(rows.num_rows), counts)
        k = first[at] + (np.arange(len(at)) - np.repeat(np.cumsum(counts) - counts, counts))
        out = rows.take(pa.array(at)).drop_columns(["window_start", "window_end"])
        return out.append_column("window_start", pa.array(bucket[at]).cast(TS)).append_column(
            "window_end", pa.array(bucket[at] + k * self.step.micros).cast(TS))

    def is_open_arrow(self, rows: pa.Table, watermark: dt.datetime) -> pa.Array:
        ends = floor_ticks(ticks(rows.column("window_start")), self.size) + self.size.micros
        return pa.array(ends > epoch_micros(watermark))

    def touched_arrow(self, changed: pa.Table, keys: Sequence[str]) -> pa.Table:
        buckets = self._bucketed_arrow(changed, keys).group_by([*keys, _BUCKET], use_threads=False).aggregate([])
        start = buckets.column(_BUCKET).to_numpy()
        return self.serve_arrow(buckets.select(list(keys)).append_column("window_start", pa.array(start).cast(TS))
                                .append_column("window_end", pa.array(start + self.step.micros).cast(TS)), keys)

    def within_arrow(self, stored: pa.Table, changed: pa.Table, keys: Sequence[str], *, anti: bool = False) -> pa.Table:
        hit = key_mask(self._bucketed_arrow(stored, keys), [*keys, _BUCKET], self._bucketed_arrow(changed, keys))
        return stored.filter(pa.array(~hit if anti else hit))

    def rollup_rows(self, rows: pa.Table) -> pa.Table:
        """The complete windows: one a bucket, the merge of all its slices."""
        span = ticks(rows.column("window_end")) - ticks(rows.column("window_start"))
        return rows.filter(pa.array(span == self.size.micros))

    def _bucketed_arrow(self, rows: pa.Table, keys: Sequence[str]) -> pa.Table:
        bucket = floor_ticks(ticks(rows.column("window_start")), self.size)
        return rows.select(list(keys)).append_column(_BUCKET, pa.array(bucket))
