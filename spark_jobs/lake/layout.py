"""The columns each table of a pipeline holds, as Arrow schemas, from its spec alone (no Spark).

Spark's phases write these columns; ``plan`` shows them for a lake that does not exist yet, and
``apply`` adds the columns of a new aggregate with them, without starting a JVM. Every table ends
with ``spec_version``: the oldest spec version among the rows merged into a row (a row of
``partials`` is written by one version). An aggregate added at version ``v`` is covered by a row
only when its ``spec_version`` is at least ``v``; a row of an older version lacks its accumulator, and
the value is NULL, never a partial one (:class:`spark_jobs.phases.CompiledAggregates` masks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_jobs.aggregates import AggregateFunction, create
from spark_jobs.aggregates.builtins import ARROW_TYPES

if TYPE_CHECKING:
    from spark_jobs.spec import PipelineSpec, RollupSpec

__all__ = ["ADOPTED", "SPEC_VERSION", "TS", "key_fields", "table_schema", "value_fields"]

SPEC_VERSION = "spec_version"
# The spec version of rows written before the lake recorded its spec (NULL in ``spec_version``): the spec
# the lake adopted on its first ``apply``, version 1.
ADOPTED = 1
TS = pa.timestamp("us", tz="UTC")


def key_fields(spec: PipelineSpec, keys: tuple[str, ...] | None = None) -> list[pa.Field]:
    """The group keys (``keys``, default all) and, with a window, its bounds."""
    types = spec.source.columns
    return [*(pa.field(k, ARROW_TYPES[types[k]]) for k in (spec.group_by if keys is None else keys)),
            *(pa.field(bound, TS) for bound in spec.window.bounds)]


def _functions(spec: PipelineSpec) -> list[tuple[str, AggregateFunction[Any, Any]]]:
    schema, retracting = spec.source.columns, spec.source.op_column is not None
    return [(agg.name, create(agg.fn, name=agg.name, columns=agg.columns, args=dict(agg.args),
                              input_type=schema.get(agg.columns[0]) if agg.columns else None, retracting=retracting))
            for agg in spec.aggregates]


def value_fields(spec: PipelineSpec) -> list[pa.Field]:
    """One column per aggregate, its value."""
    return [pa.field(name, fn.value_type()) for name, fn in _functions(spec)]


# what every changelog row says of the commit it tells: its writer (stream, reduce, apply), run, and the version of
# ``aggregates`` it made (the log's order: by that version, then ``seq``)
CHANGE_STAMP = (pa.field("writer", pa.string()), pa.field("run_id", pa.string()),
                pa.field("aggregates_version", pa.int64()))


def table_schema(spec: PipelineSpec, table: str, rollup: RollupSpec | None = None) -> pa.Schema:
    """The columns of ``partials``, ``aggregates``, ``changelog``, ``state`` (the stream's) or a rollup table."""
    keys = key_fields(spec)
    accs = [pa.field(f"{name}__{f}", t) for name, fn in _functions(spec)  # each accumulator's ``<name>__<field>``
            for f, t in zip(fn.acc_fields, fn.acc_types(), strict=True)]
    n_rows, version = pa.field("n_rows", pa.int64()), pa.field(SPEC_VERSION, pa.int64())
    if table == "partials":
        fields = [pa.field("batch", pa.string()), pa.field("source", pa.string()), pa.field("event_date", pa.date32()),
                  *keys, n_rows, *accs, pa.field("run_id", pa.string()), pa.field("created_at", TS), version]
    elif table == "aggregates" or table.startswith("rollup_"):
        if table != "aggregates":
            assert rollup is not None, "a rollup table's columns depend on its declaration"
            keys = key_fields(spec, rollup.by)
        fields = [*keys, *value_fields(spec), n_rows, *accs, pa.field("updated_at", TS),
                  pa.field("run_id", pa.string()), version]
    elif table == "changelog":
        fields = [pa.field("op", pa.string()), *keys, *value_fields(spec), pa.field("batch_id", pa.int64()),
                  pa.field("seq", pa.int64()), *CHANGE_STAMP]
    elif table == "state":
        fields = [pa.field("event_date", pa.date32()), *keys, n_rows, *accs, pa.field("max_event_time", TS), version]
    else:
        raise ValueError(f"no layout for table {table!r}")
    return pa.schema(fields)
