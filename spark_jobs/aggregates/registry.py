"""Find the aggregate a spec entry names and check it fits the source columns."""

from __future__ import annotations

import importlib
from typing import Any

from spark_jobs.aggregates.base import AggregateFunction
from spark_jobs.aggregates.builtins import BUILTINS, NUMERIC, RETRACTING, Builtin
from spark_jobs.spec import AggregateSpec

__all__ = ["load_user_aggregate", "resolve", "validate_aggregate"]


def load_user_aggregate(path: str) -> type[AggregateFunction[Any, Any]]:
    """Import ``"package.module:Class"``; raise ValueError saying what to fix."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"bad user-defined aggregate {path!r}; write it as 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} ({exc}); install the package where the jobs run "
                         "or fix the module path") from exc
    cls = getattr(module, attr, None)
    if not isinstance(cls, type) or not issubclass(cls, AggregateFunction):
        raise ValueError(f"{path!r} is not a subclass of spark_jobs.aggregates.AggregateFunction; "
                         "subclass it and implement create_accumulator, accumulate, merge and get_value")
    return cls


_NO_RETRACT = ("cannot retract, so it cannot consume a changelog source's -U/-D rows (source.op_column); "
               "use count, sum, avg, min or max, or remove source.op_column")


def validate_aggregate(agg: AggregateSpec, schema: dict[str, str], *, retracting: bool = False) -> list[tuple[str, str]]:
    """Problems with one spec entry as (field, message) pairs; empty when it is fine.

    ``retracting``: the source is a changelog (+I/-U/+U/-D), so the aggregate must retract.
    """
    if agg.user_defined:
        try:
            cls = load_user_aggregate(agg.fn)
        except ValueError as exc:
            return [("fn", str(exc))]
        problems = []
        if retracting and cls.retract is AggregateFunction.retract:
            problems.append(("fn", f"{agg.fn} does not implement retract: it {_NO_RETRACT}"))
        if cls.merge is AggregateFunction.merge:
            problems.append(("fn", f"{agg.fn} does not implement merge; two-phase aggregation needs it"))
        if cls.accumulator_type is None or cls.result_type is None:
            problems.append(("fn", f"{agg.fn} must set accumulator_type and result_type (pyarrow types)"))
        if cls.num_inputs is not None and len(agg.columns) != cls.num_inputs:
            problems.append(("columns", f"{agg.fn} takes {cls.num_inputs} column(s), got {list(agg.columns)}"))
        try:
            cls(**dict(agg.args))
        except TypeError as exc:
            problems.append(("args", f"{agg.fn} does not accept args {dict(agg.args)}: {exc}"))
        return problems
    builtin = BUILTINS.get(agg.fn)
    if builtin is None:
        return [("fn", f"unknown function {agg.fn!r}; use one of {', '.join(BUILTINS)} "
                       "or 'package.module:Class' for a user-defined aggregate")]
    problems = builtin.check_args(dict(agg.args))
    if retracting and agg.fn not in RETRACTING:
        problems.append(("fn", f"{agg.fn} {_NO_RETRACT}"))
    if builtin.column_required and len(agg.columns) != 1:
        problems.append(("column", f"{agg.fn} needs exactly one column; add column: <name>"))
    elif not builtin.column_required and len(agg.columns) > 1:
        problems.append(("columns", f"{agg.fn} takes at most one column, got {list(agg.columns)}"))
    if builtin.numeric_only and agg.columns and schema.get(agg.columns[0], "double") not in NUMERIC:
        col = agg.columns[0]
        problems.append(("column", f"{agg.fn} needs a numeric column; {col!r} is {schema[col]}"))
    return problems


def resolve(agg: AggregateSpec, schema: dict[str, str], *, retracting: bool = False) -> AggregateFunction[Any, Any]:
    """The aggregate object for a validated spec entry (its retracting form for a changelog source)."""
    if agg.user_defined:
        return load_user_aggregate(agg.fn)(**dict(agg.args))
    cls: type[Builtin] = RETRACTING[agg.fn] if retracting else BUILTINS[agg.fn]
    return cls(agg, schema.get(agg.columns[0]) if agg.columns else None)
