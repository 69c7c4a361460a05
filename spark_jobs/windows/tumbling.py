"""Tumbling windows: ``[k·size, (k+1)·size)`` from the epoch, as Spark's ``window`` counts them. Each event is in one
window; stored and served rows are the same windows, and a coarser tumbling grid is a merge of whole windows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from spark_jobs.durations import Duration
from spark_jobs.windows.kind import TS, F, SizedWindows, WindowChange, WindowKind, floor_micros, floor_ticks, ticks

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import DataFrame

__all__ = ["Tumbling", "TiledWindows"]


@dataclass(frozen=True)
class TiledWindows(SizedWindows):
    """Windows over a grid of tiles from the epoch (tumbling, and the slices of cumulative windows)."""

    unit = "window"  # what a stored tile is called

    @property
    def tile(self) -> Duration:
        return self.size

    grid = start_step = tile  # grid: the stored rows' tile (an event's stored window is the tile that holds it)

    def assign(self, rows: DataFrame, *, event_time: str, keys: Sequence[str]) -> DataFrame:
        window = F.window(F.col(event_time), self.grid.spark)
        return rows.withColumns({"window_start": window.start, "window_end": window.end})

    def coarsen(self, rows: DataFrame) -> DataFrame:
        start = floor_micros(F.unix_micros(F.col("window_start")), self.grid)
        return rows.withColumns({"window_start": F.timestamp_micros(start),
                                 "window_end": F.timestamp_micros(start + F.lit(self.grid.micros))})

    def coarsen_arrow(self, rows: pa.Table) -> pa.Table:
        start = floor_ticks(ticks(rows.column("window_start")), self.grid)
        rows = rows.drop_columns(["window_start", "window_end"])
        return rows.append_column("window_start", pa.array(start).cast(TS)).append_column(
            "window_end", pa.array(start + self.grid.micros).cast(TS))

    def change_to(self, new: WindowKind) -> WindowChange:
        if isinstance(new, TiledWindows) and new.grid.seconds % self.grid.seconds == 0:
            n = new.grid.seconds // self.grid.seconds
            effect = (f"each {new.grid} {new.unit} merges its {n} {self.grid} {self.unit}s" if n > 1 else
                      f"the stored {self.grid} {self.unit}s stand; aggregates merge them into the new windows")
            return WindowChange("stored", f"window {self} -> {new}", effect, retile=n > 1)
        if not new.bounds:
            return WindowChange("stored", f"window of {self} removed", "every key's windows are merged into one row",
                                unwindow=True)
        how = ("refined" if isinstance(new, TiledWindows) and new.grid.seconds < self.grid.seconds
               else "shifted or made hopping")
        return WindowChange("raw", f"window {self} -> {new} ({how})",
                            "the stored windows do not tile the new ones: every day's partials are dropped and must "
                            "be recombined")


@dataclass(frozen=True)
class Tumbling(TiledWindows):
    def to_dict(self) -> dict[str, str]:
        return {"size": str(self.size)}

    def __str__(self) -> str:
        return str(self.size)
