"""Compile a spec's aggregates into the two Spark phases, as pure DataFrame transforms: ``partial_aggregate``
(combine: raw rows -> one accumulator row per key) and ``final_aggregate`` (reduce: accumulator rows -> merged
accumulators and values). Built-ins run as Spark's native aggregate expressions; user-defined aggregates run
through :mod:`spark_jobs.aggregates.vectorized` and are joined back on the keys."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING

from spark_jobs.aggregates import create
from spark_jobs.aggregates.builtins import Builtin
from spark_jobs.aggregates.contract import BoundAggregate
from spark_jobs.aggregates.vectorized import udaf_merge, udaf_partials
from spark_jobs.key_match import join_on_keys
from spark_jobs.lake.layout import ADOPTED, SPEC_VERSION
from spark_jobs.spark_functions import F
from spark_jobs.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from spark_jobs.lake.spec_record import RecordedSpec

__all__ = ["CompiledAggregates", "final_aggregate", "partial_aggregate"]


class CompiledAggregates:
    """A spec's aggregates bound to their implementations, in spec order. The lake's spec ``record`` gives the version
    new rows are written by and the one from which each aggregate is covered: a merged row older than an aggregate
    serves NULL for it, never the part of the value its newer rows hold (without a record every row is version 1)."""

    def __init__(self, spec: PipelineSpec, record: RecordedSpec | None = None) -> None:
        self.spec = spec
        self.spec_version = record.version if record is not None else ADOPTED
        self.coverage = {a.name: (record.since(a.name) if record is not None else ADOPTED) for a in spec.aggregates}
        self.retracting = spec.source.op_column is not None
        self.entries: list[BoundAggregate] = [BoundAggregate(agg.name, agg.columns, create(
            agg.fn, name=agg.name, columns=agg.columns, args=dict(agg.args), retracting=self.retracting,
            input_type=spec.source.columns.get(agg.columns[0]) if agg.columns else None)) for agg in spec.aggregates]

    @cached_property
    def native(self) -> list[tuple[BoundAggregate, Builtin]]:
        """Entries Spark runs as its own aggregate expressions (or keyed aggregations)."""
        return [(b, b.function) for b in self.entries if isinstance(b.function, Builtin)]

    @cached_property
    def udafs(self) -> list[BoundAggregate]:
        """Entries Spark runs through Arrow batches (user-defined aggregates)."""
        return [b for b in self.entries if not isinstance(b.function, Builtin)]

    @cached_property
    def acc_columns(self) -> list[str]:
        return [c for b in self.entries for c in b.acc_columns]

    @cached_property
    def value_names(self) -> list[str]:
        return [b.name for b in self.entries]

    def value_columns(self) -> list[Column]:
        return [b.function.spark_value([F.col(c) for c in b.acc_columns]).alias(b.name)
                if isinstance(b.function, Builtin) else F.col(b.name) for b in self.entries]


SIGN = "_sign"  # -1 for the -U/-D rows of a changelog source, else 1


def partial_aggregate(rows: DataFrame, compiled: CompiledAggregates, *, extra_keys: Sequence[str] = (),
                      extra_aggs: Mapping[str, Column] | None = None) -> DataFrame:
    """Combine phase over typed, windowed rows: keys, ``n_rows`` and accumulator columns. ``extra_keys`` group
    finer than the spec's keys (the stream keeps state per event day); ``extra_aggs`` (by name) follow them."""
    spec = compiled.spec
    keys = [*extra_keys, *spec.key_columns]
    event_time = F.col(spec.source.event_time)
    op = spec.source.op_column
    sign = F.col(SIGN) if op is not None else None
    if op is not None:
        rows = rows.withColumn(SIGN, F.when(F.col(op).isin("-U", "-D"), F.lit(-1)).otherwise(F.lit(1)))
    aggs = {"n_rows": F.sum(sign) if sign is not None else F.count(F.lit(1))}  # a sum of ints is a bigint
    for b, impl in compiled.native:
        if not impl.map_view:
            value = F.col(b.columns[0]) if b.columns else None
            aggs.update(zip(b.acc_columns, impl.spark_partial(value, event_time, sign), strict=True))
    aggs.update(extra_aggs or {})
    out = (_grouped_in_place(rows, keys, aggs) if spec.window.assigned_by_key
           else rows.groupBy(*keys).agg(*(agg.alias(name) for name, agg in aggs.items())))
    for b, impl in compiled.native:
        if impl.map_view:
            out = join_on_keys(out, impl.spark_partial_frame(rows, keys, SIGN, b.acc_columns[0]), keys, "left")
    if compiled.udafs:
        out = join_on_keys(out, udaf_partials(rows, keys, compiled.udafs, sign=SIGN if sign is not None else None), keys)
    known = {*keys, "n_rows", *compiled.acc_columns}
    version = F.lit(compiled.spec_version).cast("bigint").alias(SPEC_VERSION)
    return out.select(*keys, "n_rows", *compiled.acc_columns, *(c for c in out.columns if c not in known), version)


def _grouped_in_place(rows: DataFrame, keys: Sequence[str], aggs: Mapping[str, Column]) -> DataFrame:
    """One row per group, each (bare) aggregate evaluated over its group as a window: rows ``assign`` left partitioned
    by the keys need no exchange, where Spark 4.2 would still run a partial phase and build each sketch twice."""
    from pyspark.sql import Window

    group = Window.partitionBy(*keys)
    rows = rows.withColumn("_row", F.monotonically_increasing_id())
    out = rows.select(*keys, "_row", F.min("_row").over(group).alias("_first_row"),
                      *(agg.over(group).alias(name) for name, agg in aggs.items()))
    return out.where(F.col("_row") == F.col("_first_row")).drop("_row", "_first_row")


def final_aggregate(partials: DataFrame, compiled: CompiledAggregates, *, extra_keys: Sequence[str] = (),
                    extra_aggs: Mapping[str, Column] | None = None, alone: bool = False) -> DataFrame:
    """Reduce phase over partial rows: keys, one value column per aggregate, merged accumulators. ``alone``: each
    row is a group of its own, so a built-in's merge is the row itself: no grouping (nor sketch merge) runs."""
    assert not (alone and extra_aggs), "a row alone is not grouped: no extra aggregates"
    keys = [*extra_keys, *compiled.spec.key_columns]
    exprs = [F.col("n_rows") if alone else F.sum("n_rows").alias("n_rows")]
    if SPEC_VERSION in partials.columns:  # rows from before the lake recorded its spec are its first version
        version = F.coalesce(F.col(SPEC_VERSION), F.lit(ADOPTED))
        exprs.append((version if alone else F.min(version)).cast("bigint").alias(SPEC_VERSION))
    for b, impl in compiled.native:
        accs = [F.col(c) for c in b.acc_columns]
        exprs.extend(c.alias(n) for c, n in zip(accs if alone else impl.spark_merge(accs), b.acc_columns, strict=True))
    extra = [agg.alias(name) for name, agg in (extra_aggs or {}).items()]
    merged = partials.select(*keys, *exprs) if alone else partials.groupBy(*keys).agg(*exprs, *extra)
    if compiled.retracting and not extra_keys:  # every row of the key was retracted: the key is gone
        merged = merged.where(F.col("n_rows") != 0)
    if compiled.udafs:
        merged = join_on_keys(merged, udaf_merge(partials, keys, compiled.udafs, with_value=True), keys)
    known = {*keys, "n_rows", *compiled.acc_columns, *compiled.value_names, SPEC_VERSION}
    out = merged.select(*keys, *compiled.value_columns(), "n_rows", *compiled.acc_columns,
                        *(c for c in merged.columns if c not in known),
                        *([SPEC_VERSION] if SPEC_VERSION in merged.columns else []))
    # an aggregate added or changed by a spec change is NULL in the rows whose spec_version predates it
    since = compiled.coverage
    masked = {c: F.when(F.col(SPEC_VERSION) >= since[b.name], F.col(c)).alias(c)
              for b in compiled.entries if since[b.name] > ADOPTED for c in [b.name, *b.acc_columns]}
    if masked and SPEC_VERSION in out.columns:
        out = out.select(*(masked.get(c, F.col(c)) for c in out.columns))
    return out
