"""``count_distinct`` of a changelog source: a count per value, as Flink's distinct aggregate keeps it in a MapView,
so a -U/-D row retracts its value exactly and the value leaves the count when its last row does."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from spark_jobs.aggregates.builtin_base import Column, F, builtin
from spark_jobs.aggregates.map_view import CountsMapView

__all__ = ["CountDistinctMapView"]


@builtin(changelog_form=True)
class CountDistinctMapView(CountsMapView):
    """The number of values whose count is > 0; 0 over no live value, as ``count(DISTINCT)`` is."""

    fn = "count_distinct"
    result_type = pa.int64()

    def get_value(self, acc: dict[Any, int]) -> int:
        return len(self.present(acc))

    def spark_value(self, accs: list[Column]) -> Column:  # no live value: a NULL map (size -1 without ANSI)
        return F.when(accs[0].isNull(), F.lit(0)).otherwise(F.size(self.spark_present(accs[0]))).cast("bigint")
