"""No window: each key's aggregate over all time (Flink's group aggregation). Stored rows are a key's rows of a
day; nothing closes, so the stream's state of a key lives as long as the key."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from spark_jobs.windows.kind import RECOMBINE, F, WindowChange, WindowKind

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["Unwindowed"]


@dataclass(frozen=True)
class Unwindowed(WindowKind):
    bounds = ()
    scope = ()
    closes = False

    def to_dict(self) -> None:
        return None

    def __str__(self) -> str:
        return "none"

    @property
    def rollup_refusal(self) -> str:
        return ("rollups merge whole tumbling windows, and without a window aggregates hold all time per key; "
                "declare a window without a slide, e.g. {size: 1 hour}")

    def is_open(self, watermark: dt.datetime) -> Column:
        return F.lit(True)

    def is_open_arrow(self, rows: pa.Table, watermark: dt.datetime) -> pa.Array:
        return pa.array(np.ones(rows.num_rows, dtype=bool))

    def change_to(self, new: WindowKind) -> WindowChange:
        return WindowChange("raw", f"window added: {new}", f"the stored rows span all time: {RECOMBINE}")
