"""``explain``: a phase's plan, as Flink shows LocalGroupAggregate / GlobalGroupAggregate. For each aggregate: the
columns its accumulator is stored as, its local (combine) expression, its global (reduce) merge and its value; then
Spark's physical plan of the phase over an empty, typed input, so nothing is read."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from spark_jobs.aggregates.builtins import Builtin
from spark_jobs.lake.table_rules import DAY
from spark_jobs.phases.compiled import SIGN, CompiledAggregates, final_aggregate, partial_aggregate
from spark_jobs.spark_functions import F

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["PHASES", "Phase", "aggregate_table", "explain", "phase_frame"]

Phase = Literal["combine", "reduce", "stream"]
PHASES: tuple[Phase, ...] = ("combine", "reduce", "stream")
_OPERATOR = {"combine": "LocalGroupAggregate", "reduce": "GlobalGroupAggregate",
             "stream": "MiniBatchLocalGroupAggregate + MiniBatchGlobalGroupAggregate (state per event day)"}


def _text(column: Column) -> str:
    return str(column).removeprefix("Column<'").removesuffix("'>")


def aggregate_table(compiled: CompiledAggregates) -> list[dict[str, str]]:
    """One row per aggregate: stored columns and the expressions of each phase."""
    sign = F.col(SIGN) if compiled.retracting else None
    event_time = F.col(compiled.spec.source.event_time)
    rows = []
    for b in compiled.entries:
        fn = b.function
        stored = ", ".join(b.acc_columns)
        accs = [F.col(c) for c in b.acc_columns]
        if isinstance(fn, Builtin) and fn.map_view:
            local = f"keyed: sum({SIGN}) per ({', '.join(b.columns)}) -> map<value, count>"
            merge = "collect_list, summed per value (map_zip_with), zero counts dropped -> map<value, count>"
        elif isinstance(fn, Builtin):
            value_col = F.col(b.columns[0]) if b.columns else None
            local = "; ".join(_text(c) for c in fn.spark_partial(value_col, event_time, sign))
            merge = "; ".join(_text(c) for c in fn.spark_merge(accs))
        else:
            local = f"mapInArrow: {type(fn).__name__}.accumulate_batch({', '.join(b.columns)})"
            merge = f"mapInArrow: {type(fn).__name__}.merge_all({stored})"
        value = _text(fn.spark_value(accs)) if isinstance(fn, Builtin) else f"{type(fn).__name__}.get_value({stored})"
        rows.append({"aggregate": b.name, "function": type(fn).__name__, "stored as": stored,
                     "local (combine)": local, "global (reduce)": merge, "value": value})
    return rows


def phase_frame(spark: SparkSession, compiled: CompiledAggregates, phase: Phase) -> DataFrame:
    """The phase's DataFrame over an empty, typed input."""
    spec = compiled.spec
    ddl = ", ".join(f"`{c}` {t}" for c, t in spec.source.schema)
    rows = spec.window.assign(spark.createDataFrame([], ddl), event_time=spec.source.event_time, keys=spec.group_by)
    if phase == "combine":
        return partial_aggregate(rows, compiled)
    if phase == "reduce":
        empty = spark.createDataFrame([], partial_aggregate(rows, compiled).schema)
        return final_aggregate(spec.window.serve(empty, spec.group_by), compiled)
    et = F.col(spec.source.event_time)
    delta = partial_aggregate(rows.withColumn(DAY, F.to_date(et)), compiled, extra_keys=[DAY],
                              extra_aggs={"max_event_time": F.max(et)})
    state = spark.createDataFrame([], delta.schema)
    return final_aggregate(state.unionByName(delta), compiled, extra_keys=[DAY],
                           extra_aggs={"max_event_time": F.max("max_event_time")})


def explain(spark: SparkSession, compiled: CompiledAggregates, phase: Phase) -> str:
    """The text ``python -m spark_jobs explain`` prints (without Spark's plan, which it prints itself)."""
    spec = compiled.spec
    keys = ([DAY] if phase == "stream" else []) + list(spec.key_columns)
    lines = [f"{spec.name}: {phase} = {_OPERATOR[phase]}",
             f"  group by: {', '.join(keys) or '(one global group)'}"
             + ("; source is a changelog: -U/-D rows retract (_sign = -1)" if compiled.retracting else "")]
    if (line := spec.window.explain(phase)) is not None:
        lines.append(f"  {line}")
    lines.append("")
    for row in aggregate_table(compiled):
        lines.append(f"  {row['aggregate']} = {row['function']}")
        for label in ("stored as", "local (combine)", "global (reduce)", "value"):
            lines.append(f"      {label + ':':<17}{row[label]}")
    return "\n".join(lines)
