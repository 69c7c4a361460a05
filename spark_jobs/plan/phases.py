"""Compile a spec's aggregates into the two Spark phases, as pure DataFrame transforms.

``partial_aggregate`` is the combine-group phase (raw rows -> one accumulator row per key),
``final_aggregate`` the reduce-group phase (accumulator rows -> merged accumulators and
values). Built-ins run as Spark's native aggregate expressions; user-defined aggregates
run through :mod:`spark_jobs.aggregates.vectorized` and are joined back on the keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING

from spark_jobs.aggregates.builtins import Builtin
from spark_jobs.aggregates.registry import resolve
from spark_jobs.aggregates.vectorized import UserAggregate, udaf_merge, udaf_partials
from spark_jobs.spec import AggregateSpec, PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["CompiledAggregates", "assign_windows", "final_aggregate", "partial_aggregate", "with_sign"]


class CompiledAggregates:
    """A spec's aggregates bound to their implementations, in spec order."""

    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec
        self.retracting = spec.source.op_column is not None
        schema = spec.source.columns
        self.entries: list[tuple[AggregateSpec, Builtin | UserAggregate]] = []
        for agg in spec.aggregates:
            impl = resolve(agg, schema, retracting=self.retracting)
            if isinstance(impl, Builtin):
                self.entries.append((agg, impl))
            else:
                self.entries.append((agg, UserAggregate(agg.name, impl, agg.columns)))

    @cached_property
    def builtins(self) -> list[tuple[AggregateSpec, Builtin]]:
        return [(a, i) for a, i in self.entries if isinstance(i, Builtin)]

    @cached_property
    def udafs(self) -> list[UserAggregate]:
        return [i for _, i in self.entries if isinstance(i, UserAggregate)]

    @cached_property
    def acc_columns(self) -> list[str]:
        out: list[str] = []
        for _, impl in self.entries:
            out.extend(impl.acc_columns() if isinstance(impl, Builtin) else [impl.acc_column])
        return out

    @cached_property
    def value_names(self) -> list[str]:
        return [agg.name for agg, _ in self.entries]

    def value_columns(self) -> list[Column]:
        from pyspark.sql import functions as F

        out = []
        for agg, impl in self.entries:
            if isinstance(impl, Builtin):
                out.append(impl.spark_value([F.col(c) for c in impl.acc_columns()]).alias(agg.name))
            else:
                out.append(F.col(agg.name))
        return out


def assign_windows(df: DataFrame, spec: PipelineSpec) -> DataFrame:
    """Add ``window_start``/``window_end`` (one row per window for hopping windows)."""
    from pyspark.sql import functions as F

    if spec.window is None:
        return df
    size = spec.window.size.spark
    slide = spec.window.slide.spark if spec.window.hopping and spec.window.slide else None
    w = F.window(F.col(spec.source.event_time), size, slide) if slide else F.window(F.col(spec.source.event_time), size)
    return (df.withColumn("_window", w)
            .withColumn("window_start", F.col("_window.start"))
            .withColumn("window_end", F.col("_window.end"))
            .drop("_window"))


def _join(left: DataFrame, right: DataFrame, keys: list[str], how: str = "inner") -> DataFrame:
    from pyspark.sql import functions as F

    return left.join(right, keys, how) if keys else left.join(right, F.lit(True), how)


SIGN = "_sign"


def with_sign(rows: DataFrame, spec: PipelineSpec) -> DataFrame:
    """Add ``_sign``: -1 for the -U/-D rows of a changelog source, else 1."""
    from pyspark.sql import functions as F

    op = spec.source.op_column
    sign = F.when(F.col(op).isin("-U", "-D"), F.lit(-1)).otherwise(F.lit(1)) if op else F.lit(1)
    return rows.withColumn(SIGN, sign)


def _map_view_partial(rows: DataFrame, keys: list[str], column: str, acc: str) -> DataFrame:
    """Per key, a map of value -> signed count: the accumulator of min/max over a changelog."""
    from pyspark.sql import functions as F

    counts = (rows.where(F.col(column).isNotNull()).groupBy(*keys, F.col(column).alias("_v"))
              .agg(F.sum(SIGN).cast("bigint").alias("_n")).where(F.col("_n") != 0))
    return counts.groupBy(*keys).agg(F.map_from_entries(F.collect_list(F.struct("_v", "_n"))).alias(acc))


def _map_view_merge(partials: DataFrame, keys: list[str], acc: str) -> DataFrame:
    from pyspark.sql import functions as F

    entries = partials.select(*keys, F.explode(acc).alias("_v", "_n"))
    counts = entries.groupBy(*keys, "_v").agg(F.sum("_n").alias("_n")).where(F.col("_n") != 0)
    return counts.groupBy(*keys).agg(F.map_from_entries(F.collect_list(F.struct("_v", "_n"))).alias(acc))


def partial_aggregate(rows: DataFrame, compiled: CompiledAggregates, *, extra_keys: Sequence[str] = (),
                      extra_aggs: Sequence[Column] = ()) -> DataFrame:
    """Combine phase over typed, windowed rows: keys, ``n_rows`` and accumulator columns.

    ``extra_keys`` group finer than the spec's keys (the stream keeps state per event day);
    ``extra_aggs`` are appended after the accumulators.
    """
    from pyspark.sql import functions as F

    spec = compiled.spec
    keys = [*extra_keys, *spec.key_columns]
    event_time = F.col(spec.source.event_time)
    sign = F.col(SIGN) if compiled.retracting else None
    if compiled.retracting:
        rows = with_sign(rows, spec)
    exprs = [F.sum(sign).cast("bigint").alias("n_rows") if sign is not None else F.count(F.lit(1)).alias("n_rows")]
    for agg, impl in compiled.builtins:
        if impl.map_view:
            continue
        value = F.col(agg.columns[0]) if agg.columns else None
        exprs.extend(c.alias(n) for c, n in zip(impl.spark_partial(value, event_time, sign), impl.acc_columns(),
                                                strict=True))
    out = rows.groupBy(*keys).agg(*exprs, *extra_aggs)
    for agg, impl in compiled.builtins:
        if impl.map_view:
            out = _join(out, _map_view_partial(rows, keys, agg.columns[0], impl.acc_columns()[0]), keys, "left")
    if compiled.udafs:
        out = _join(out, udaf_partials(rows, keys, compiled.udafs, sign=SIGN if sign is not None else None), keys)
    known = {*keys, "n_rows", *compiled.acc_columns}
    return out.select(*keys, "n_rows", *compiled.acc_columns, *(c for c in out.columns if c not in known))


def final_aggregate(partials: DataFrame, compiled: CompiledAggregates, *, extra_keys: Sequence[str] = (),
                    extra_aggs: Sequence[Column] = ()) -> DataFrame:
    """Reduce phase over partial rows: keys, one value column per aggregate, merged accumulators."""
    from pyspark.sql import functions as F

    keys = [*extra_keys, *compiled.spec.key_columns]
    exprs = [F.sum("n_rows").alias("n_rows")]
    for _, impl in compiled.builtins:
        if not impl.map_view:
            accs = [F.col(c) for c in impl.acc_columns()]
            exprs.extend(c.alias(n) for c, n in zip(impl.spark_merge(accs), impl.acc_columns(), strict=True))
    merged = partials.groupBy(*keys).agg(*exprs, *extra_aggs)
    if compiled.retracting and not extra_keys:  # every row of the key was retracted: the key is gone
        merged = merged.where(F.col("n_rows") != 0)
    for _, impl in compiled.builtins:
        if impl.map_view:
            merged = _join(merged, _map_view_merge(partials, keys, impl.acc_columns()[0]), keys, "left")
    if compiled.udafs:
        merged = _join(merged, udaf_merge(partials, keys, compiled.udafs, with_value=True), keys)
    known = {*keys, "n_rows", *compiled.acc_columns, *compiled.value_names}
    return merged.select(*keys, *compiled.value_columns(), "n_rows", *compiled.acc_columns,
                         *(c for c in merged.columns if c not in known))
