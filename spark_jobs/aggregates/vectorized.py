"""Two-phase execution of user-defined aggregates over Arrow batches (Flink's local-global). Local phase
(``mapInArrow``): each Spark task buffers up to ``flush_rows`` rows, sorts them by key once, and hands each group's
zero-copy slice to ``accumulate_batch``: one Python call per group and buffer, never per row. It emits one partial
accumulator per key per task. Global phase: partials are hash-partitioned by key and merged with ``merge_batch``. No
group is ever shipped whole to one worker: only its partial accumulators are."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.aggregates.contract import BoundAggregate

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["udaf_merge", "udaf_partials"]

FLUSH_ROWS = 262_144


def _grouped(table: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, list[tuple[Any, ...]], np.ndarray]:
    """``table`` sorted by key, each group's key and the group offsets. Arrow's hash grouping on the Arrow
    values: NULL is its own group, NaN its own, and 64-bit integers stay exact."""
    if not keys:
        return table, [()], np.array([0, table.num_rows])
    index = pa.array(np.arange(table.num_rows, dtype=np.int64))
    groups = (table.select(list(keys)).append_column("__row", index)
              .group_by(list(keys), use_threads=False).aggregate([("__row", "list")]))
    rows = groups.column("__row_list").combine_chunks()
    key_values = [_plain(groups.column(k)) for k in keys]
    return table.take(rows.flatten()).combine_chunks(), list(zip(*key_values, strict=True)), rows.offsets.to_numpy()


def _plain(column: pa.ChunkedArray) -> list[Any]:
    """Python values of a key column; temporal values as their integer form (datetime objects are slow)."""
    if pa.types.is_timestamp(column.type) or pa.types.is_date(column.type):
        return column.cast(pa.int64() if pa.types.is_timestamp(column.type) else pa.int32()).to_pylist()
    return column.to_pylist()


def _key_array(values: list[Any], type_: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(type_) or pa.types.is_date(type_):  # from the integer form ``_plain`` gives them
        return pa.array(values, pa.int64() if pa.types.is_timestamp(type_) else pa.int32()).cast(type_)
    return pa.array(values, type=type_)


def _buffered(batches: Iterator[pa.RecordBatch], flush_rows: int) -> Iterator[pa.Table]:
    buf: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        buf.append(batch)
        rows += batch.num_rows
        if rows >= flush_rows:
            yield pa.Table.from_batches(buf)
            buf, rows = [], 0
    if buf:
        yield pa.Table.from_batches(buf)


def _emit(state: dict[tuple[Any, ...], list[Any]], key_fields: list[pa.Field], aggs: Sequence[BoundAggregate],
          with_value: bool) -> pa.RecordBatch:
    keys = list(state)
    arrays = [_key_array([k[i] for k in keys], f.type) for i, f in enumerate(key_fields)]
    names = [f.name for f in key_fields]
    for j, agg in enumerate(aggs):
        accs = [state[k][j] for k in keys]
        arrays.append(pa.array([agg.function.encode(a)[0] for a in accs], type=agg.function.accumulator_type))
        names.append(agg.acc_columns[0])
        if with_value:
            arrays.append(pa.array([agg.function.get_value(a) for a in accs], type=agg.function.result_type))
            names.append(agg.name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _schemas(df: DataFrame, keys: Sequence[str], aggs: Sequence[BoundAggregate], with_value: bool
             ) -> tuple[Any, list[pa.Field]]:
    """The Spark schema of the batches ``_emit`` makes, and the Arrow fields of their keys."""
    from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type
    from pyspark.sql.types import StructField, StructType

    fields = [df.schema[k] for k in keys]
    for agg in aggs:
        fields.append(StructField(agg.acc_columns[0], from_arrow_type(agg.function.accumulator_type)))
        if with_value:
            fields.append(StructField(agg.name, from_arrow_type(agg.function.result_type)))
    return StructType(fields), [pa.field(k, to_arrow_type(df.schema[k].dataType, timezone="UTC")) for k in keys]


def udaf_partials(df: DataFrame, keys: Sequence[str], aggs: Sequence[BoundAggregate],
                  flush_rows: int = FLUSH_ROWS, sign: str | None = None) -> DataFrame:
    """Combine phase: one accumulator per key and aggregate; ``sign`` names a column that is -1 on rows to retract."""
    keys, aggs = list(keys), list(aggs)
    schema, key_fields = _schemas(df, keys, aggs, with_value=False)
    inputs = sorted({c for a in aggs for c in a.columns} | ({sign} if sign else set()))

    def local(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        state: dict[tuple[Any, ...], list[Any]] = {}
        for table in _buffered(batches, flush_rows):
            table, group_keys, offsets = _grouped(table, keys)
            columns = {c: table.column(c).combine_chunks() for c in inputs}
            for g, key in enumerate(group_keys):
                start, length = int(offsets[g]), int(offsets[g + 1] - offsets[g])
                if (accs := state.get(key)) is None:
                    accs = state[key] = [a.function.create_accumulator() for a in aggs]
                retract = pc.equal(columns[sign].slice(start, length), -1) if sign else None
                if retract is not None and not pc.any(retract).as_py():
                    retract = None
                for j, agg in enumerate(aggs):
                    arrays = [columns[c].slice(start, length) for c in agg.columns]
                    if retract is None:
                        accs[j] = agg.function.accumulate_batch(accs[j], *arrays)
                    else:
                        keep = pc.invert(retract)
                        accs[j] = agg.function.accumulate_batch(accs[j], *(a.filter(keep) for a in arrays))
                        accs[j] = agg.function.retract_batch(accs[j], *(a.filter(retract) for a in arrays))
        if state:
            yield _emit(state, key_fields, aggs, with_value=False)

    local_partials = df.select(*keys, *inputs).mapInArrow(local, schema)
    return udaf_merge(local_partials, keys, aggs, with_value=False, flush_rows=flush_rows)


def udaf_merge(partials: DataFrame, keys: Sequence[str], aggs: Sequence[BoundAggregate], *,
               with_value: bool = True, flush_rows: int = FLUSH_ROWS) -> DataFrame:
    """Reduce phase: merge partial accumulators per key; add the result when ``with_value``."""
    keys, aggs = list(keys), list(aggs)
    schema, key_fields = _schemas(partials, keys, aggs, with_value=with_value)

    def merge(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        state: dict[tuple[Any, ...], list[Any]] = {}
        for table in _buffered(batches, flush_rows):
            table, group_keys, offsets = _grouped(table, keys)
            columns = [table.column(a.acc_columns[0]).to_pylist() for a in aggs]
            for g, key in enumerate(group_keys):
                start, stop = int(offsets[g]), int(offsets[g + 1])
                accs = state.get(key)
                previous = [[acc] for acc in accs] if accs is not None else [[] for _ in aggs]
                state[key] = [agg.function.merge_all([*previous[j], *(agg.function.decode([v])
                                                                      for v in columns[j][start:stop])])
                              for j, agg in enumerate(aggs)]
        if state:
            yield _emit(state, key_fields, aggs, with_value=with_value)

    shuffled = partials.select(*keys, *(a.acc_columns[0] for a in aggs))
    shuffled = shuffled.repartition(*keys) if keys else shuffled.repartition(1)
    return shuffled.mapInArrow(merge, schema)
