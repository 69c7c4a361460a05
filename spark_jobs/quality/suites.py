"""A pipeline's Great Expectations suites, from its spec and quality rules: lists of GX expectations, not yet bound
to a context, that :mod:`gate` runs against a Spark DataFrame. The columns they read:

- input (the classified landing partition, see :func:`spark_jobs.jobs.landing.classify`): the spec's typed columns,
  ``_reason`` (why combine would reject the row, NULL when valid) and ``_event_day`` (the event time's UTC date);
- outputs (the serving table, or a day's partials finalised as reduce would): the group keys, ``n_rows`` and one
  column per aggregate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from spark_jobs.lake.layout import ADOPTED, SPEC_VERSION
from spark_jobs.quality.thresholds import QualityRules, Range
from spark_jobs.spark_functions import F
from spark_jobs.spec import PipelineSpec

if TYPE_CHECKING:
    from great_expectations.expectations import Expectation
    from pyspark.sql import Column

    from spark_jobs.phases.compiled import CompiledAggregates

__all__ = ["coverage_columns", "input_expectations", "output_expectations"]

UNCOVERED = "_uncovered_"  # + aggregate: its value where the row predates it (must be NULL)


def coverage_columns(compiled: CompiledAggregates, columns: Sequence[str]) -> list[Column]:
    """Per aggregate added by a spec change, its value in the rows older than it: NULL unless a partial
    value leaked (the outputs suite expects NULL)."""
    return [F.when(F.col(SPEC_VERSION) < since, F.col(name)).alias(f"{UNCOVERED}{name}")
            for name, since in compiled.coverage.items() if since > ADOPTED and name in columns
            ] if SPEC_VERSION in columns else []


COUNT_FNS = ("count", "count_distinct", "approx_count_distinct")


def _between(column: str, rng: Range) -> Expectation:
    import great_expectations.expectations as gxe

    bounds: dict[str, Any] = {"min_value": rng.min, "max_value": rng.max,
                              "mostly": rng.mostly if rng.mostly < 1 else None}
    return gxe.ExpectColumnValuesToBeBetween(column=column, description=f"range: {column} within {rng.describe()}",
                                             **{k: v for k, v in bounds.items() if v is not None})


def input_expectations(spec: PipelineSpec, rules: QualityRules, date: str) -> list[Expectation]:
    """Schema, rows present, few rejects, non-null event time (and keys, with ``null_keys: reject``), value ranges,
    freshness."""
    import great_expectations.expectations as gxe

    pct = f"{rules.max_rejected_fraction:.2%}"
    return [
        *(gxe.ExpectColumnToExist(column=col, description=f"schema: source.schema declares {col} ({typ})")
          for col, typ in spec.source.schema),
        gxe.ExpectTableRowCountToBeBetween(min_value=rules.min_rows,
                                           description=f"volume: at least {rules.min_rows} rows landed"),
        gxe.ExpectColumnValuesToBeNull(column="_reason", mostly=rules.mostly,
                                       description=f"parse: at most {pct} of rows unreadable or invalid "
                                                   "(they go to dead_letter)"),
        gxe.ExpectColumnValuesToNotBeNull(column=spec.source.event_time, mostly=rules.mostly,
                                          description=f"event time {spec.source.event_time} present "
                                                      f"(at most {pct} missing)"),
        *(gxe.ExpectColumnValuesToNotBeNull(column=k, mostly=rules.mostly,
                                            description=f"group key {k} present (at most {pct} missing)")
          for k in spec.group_by if spec.source.null_keys == "reject"),  # else a NULL key is a group
        gxe.ExpectColumnValuesToBeInSet(column="_event_day", value_set=[date], mostly=rules.mostly,
                                        description=f"freshness: event times fall on the partition's day {date}"),
        *(_between(col, rng) for col, rng in rules.input_ranges.items() if col in spec.source.columns),
    ]


def output_expectations(spec: PipelineSpec, rules: QualityRules | None, *, reconcile: dict[str, int],
                        keys: Sequence[str] | None = None, coverage: Mapping[str, int] | None = None
                        ) -> list[Expectation]:
    """No empty or negative counts, values within bounds, ``sum(n_rows)`` equal to each ``reconcile`` total, and, per
    aggregate a spec change added (``coverage``), NULL where the row predates it (see :func:`coverage_columns`). A
    rollup table passes its own ``keys`` and no ``rules``: the bounds are set for one window's values."""
    import great_expectations.expectations as gxe

    grouped = set(spec.group_by) if spec.source.null_keys == "group" else set()  # a NULL key is a group
    out: list[Expectation] = [
        gxe.ExpectColumnValuesToNotBeNull(column=k, description=f"group key {k} present")
        for k in (spec.key_columns if keys is None else keys) if k not in grouped
    ]
    out.append(gxe.ExpectColumnValuesToBeBetween(column="n_rows", min_value=1,
                                                 description="counts: every key aggregates at least one row"))
    out += [gxe.ExpectColumnValuesToBeBetween(column=a.name, min_value=0,
                                              description=f"counts: {a.name} ({a.fn}) is not negative")
            for a in spec.aggregates if a.fn in COUNT_FNS]
    bounded = {"n_rows", *(a.name for a in spec.aggregates)}
    out += [_between(col, rng) for col, rng in (rules.output_ranges if rules else {}).items() if col in bounded]
    out += [gxe.ExpectColumnSumToBeBetween(column="n_rows", min_value=total, max_value=total,
                                           description=f"reconcile: sum(n_rows) equals {what} ({total:,})")
            for what, total in reconcile.items()]
    return out + [gxe.ExpectColumnValuesToBeNull(
        column=f"{UNCOVERED}{name}", description=f"coverage: {name} (since spec version {since}) is NULL where the "
                                                "partials predate it, never a partial value")
        for name, since in (coverage or {}).items() if since > ADOPTED]
