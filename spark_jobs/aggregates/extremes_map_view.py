"""``min`` and ``max`` of a changelog source: a count per value, so retracting the extreme falls back to the next."""

from __future__ import annotations

from typing import Any, ClassVar

from spark_jobs.aggregates.builtin_base import Column, F, builtin
from spark_jobs.aggregates.map_view import CountsMapView

__all__ = ["MaxMapView", "MinMapView"]


class _ExtremeMapView(CountsMapView):
    """As Flink keeps them with a map view; Min/Max's changelog form."""

    _pick: ClassVar[Any]

    def get_value(self, acc: dict[Any, int]) -> Any:
        present = self.present(acc)
        return type(self)._pick(present) if present else None

    def spark_value(self, accs: list[Column]) -> Column:
        present = self.spark_present(accs[0])
        return F.array_min(present) if self._pick is min else F.array_max(present)


@builtin(changelog_form=True)
class MinMapView(_ExtremeMapView):
    fn = "min"
    _pick = min


@builtin(changelog_form=True)
class MaxMapView(_ExtremeMapView):
    fn = "max"
    _pick = max
