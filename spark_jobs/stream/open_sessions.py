"""When the stream's state alone answers a session batch: the state holds each open session whole (one merged
accumulator, its bounds and spec version, as Flink's keyed state holds a MergingWindowSet's windows), so a batch reads
the state rows of the keys it touches and nothing else; ``partials`` only where the state may not hold what counts:

- a row that starts before the watermark may reach a session that closed and left the state;
- a day a batch combine wrote supersedes the stream's rows of it, so a state session over that day may hold rows
  that no longer count (it is answered from ``partials`` until it closes);
- state rows of the older per-day form (a partial session per event day, written before the state held whole
  sessions): their sessions are merged from ``partials`` once, and held whole from then on.

A state session has no event day (NULL): one row holds all its days."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.lake import Lake, PipelineTables
from spark_jobs.lake.table_rules import DAY, batch_days
from spark_jobs.stream.outputs import MiniBatch
from spark_jobs.windows.kind import BOUNDS, TS, F, WindowKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["state_answers"]


def state_answers(kind: WindowKind, batch: MiniBatch, lake: Lake, tables: PipelineTables,
                  state: DataFrame | pa.Table) -> bool:
    """Whether the state's whole sessions answer the batch's reach without ``partials``, in either engine's form;
    checked every batch, since a batch combine may have landed after the stream's last commit."""
    before_watermark = batch.watermark is not None and batch.span[0] < batch.watermark
    if not kind.state_holds_served or batch.batch_days or before_watermark:
        return False
    days = [] if lake.version(tables.partials) is None else sorted(  # the days whose batch partials supersede
        dt.date.fromisoformat(d) for d in batch_days(lake.files(tables.partials)))
    return _answer_arrow(state, days) if isinstance(state, pa.Table) else _answer(state, days)


def _answer(state: DataFrame, days: list[dt.date]) -> bool:
    """No state row of the per-day form, and no state session over a superseded day (one Spark job)."""
    bad = F.col(DAY).isNotNull()
    for day in days:
        bad = bad | ((F.to_date("window_start") <= F.lit(day)) & (F.to_date("window_end") >= F.lit(day)))
    return not state.where(bad).limit(1).collect()


def _answer_arrow(state: pa.Table, days: list[dt.date]) -> bool:
    """The Arrow form of :func:`_answer`."""
    if pc.any(pc.is_valid(state.column(DAY))).as_py():
        return False
    if not days or not state.num_rows:
        return True
    first, last = (pc.cast(pc.cast(state.column(c), TS), pa.date32()).to_numpy(zero_copy_only=False) for c in BOUNDS)
    marks = np.array(days, dtype="datetime64[D]")
    return not any(bool(np.any((first <= d) & (last >= d))) for d in marks)
