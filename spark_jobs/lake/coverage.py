"""Which event days the stored partials cover, per aggregate, from Delta statistics alone (no Spark). A day's
partials are written by one spec version (``spec_version``); an aggregate added or changed at version ``v`` is
covered by a day only when the day's counted partials (the hybrid rule: batch partials when the day has them, else
the stream's) are all of version ``v`` or later. ``inspect coverage``, ``plan``, the batch DAG's skip condition and
``apply`` read it here."""

from __future__ import annotations

from collections.abc import Mapping

from spark_jobs.lake.layout import ADOPTED, SPEC_VERSION
from spark_jobs.lake.reader import is_table, open_table
from spark_jobs.lake.table_rules import BATCH, DAY

__all__ = ["day_versions", "uncovered_days"]


def day_versions(partials: str, version: int | None = None) -> dict[str, int]:
    """Per event day with partials that count, the oldest ``spec_version`` among them (0: rows a spec
    change left without any aggregate, see ``spec_record``)."""
    if not is_table(partials):
        return {}
    actions = open_table(partials, version).add_actions()

    def column(name: str) -> list[object]:  # all None without the column (no partition by day: no day at all)
        return actions.column(name).to_pylist() if name in actions.column_names else [None] * actions.num_rows

    days: dict[str, dict[str, int]] = {}  # day -> source -> oldest version
    names = [f"partition.{DAY}", "partition.source", f"min.{SPEC_VERSION}", f"null_count.{SPEC_VERSION}"]
    for day, source, low, nulls in zip(*map(column, names), strict=True):
        if day is None:
            continue
        # rows with no spec_version (written before spec records) are the adopted version
        v = ADOPTED if low is None else min(int(low), ADOPTED) if nulls else int(low)  # type: ignore[call-overload]
        by_source = days.setdefault(str(day), {})
        by_source[str(source)] = min(by_source.get(str(source), v), v)
    return {day: s[BATCH] if BATCH in s else min(s.values()) for day, s in sorted(days.items())}


def uncovered_days(coverage: Mapping[str, int], versions: Mapping[str, int]) -> dict[str, list[str]]:
    """Per aggregate, the days whose partials predate it (it is NULL in their windows until they are recombined)."""
    return {name: [day for day, v in versions.items() if v < since] for name, since in coverage.items()}
