"""Hopping windows: ``size`` long, one starting every ``slide`` (Spark's ``window(t, size, slide)``). An event is in
``size / slide`` windows, each stored as it is served; they overlap, so they neither merge into rollups nor
into a coarser grid."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_jobs.durations import Duration
from spark_jobs.windows.kind import RECOMBINE, F, SizedWindows, WindowChange, WindowKind

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import Column, DataFrame

__all__ = ["Hopping"]


@dataclass(frozen=True)
class Hopping(SizedWindows):
    slide: Duration
    rows_once = False

    def to_dict(self) -> dict[str, str]:
        return {"size": str(self.size), "slide": str(self.slide)}

    def __str__(self) -> str:
        return f"{self.size} every {self.slide}"

    @property
    def windows_per_row(self) -> int:  # type: ignore[override]
        return -(-self.size.seconds // self.slide.seconds)

    @property
    def rollup_refusal(self) -> str:
        return ("rollups merge whole tumbling windows, and hopping windows overlap (merging them would count rows "
                f"several times); declare a window without a slide instead of {self}")

    @property
    def start_step(self) -> Duration:
        return self.slide

    def assign(self, rows: DataFrame, *, event_time: str, keys: Sequence[str]) -> DataFrame:
        window = F.window(F.col(event_time), self.size.spark, self.slide.spark)
        return rows.withColumns({"window_start": window.start, "window_end": window.end})

    def count_once(self, event_time: str) -> Column:
        """An event's copies count in its last window only: the one it entered less than a slide after the start."""
        since_start = F.unix_micros(F.col(event_time)) - F.unix_micros(F.col("window_start"))
        return F.count(F.when(since_start < F.lit(self.slide.micros), 1))

    def open_only(self, rows: DataFrame, watermark: dt.datetime) -> DataFrame:
        """A row's copies in the windows that closed are dropped; it counts in the open ones (Flink's HOP)."""
        return rows.where(F.col("window_end").isNull() | self.is_open(watermark))

    def change_to(self, new: WindowKind) -> WindowChange:
        if not new.bounds:
            return WindowChange("raw", "hopping window removed",
                                f"hopping windows overlap, so merging them would count rows twice: {RECOMBINE}")
        return super().change_to(new)
