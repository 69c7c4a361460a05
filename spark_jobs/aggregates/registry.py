"""Find the aggregate a spec entry names and check it fits the source columns: from the entry's plain fields
(``fn``, ``columns``, ``args``), so the spec validates its aggregates here without the algebra knowing the spec."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from spark_jobs.aggregates.builtins import BUILTINS, NUMERIC, RETRACTING, Builtin
from spark_jobs.aggregates.contract import AggregateFunction
from spark_jobs.errors import SpecError

__all__ = ["create", "is_user_defined", "load_user_aggregate", "validate_aggregate"]

log = logging.getLogger("spark_jobs")


def is_user_defined(fn: str) -> bool:
    return ":" in fn


def load_user_aggregate(path: str) -> type[AggregateFunction[Any, Any]]:
    """Import ``"package.module:Class"``; raise SpecError saying what to fix."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise SpecError(path, [f"bad user-defined aggregate {path!r}; write it as 'package.module:Class'"])
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(path, [f"cannot import {module_name!r} ({exc}); install the package where the jobs run "
                               "or fix the module path"]) from exc
    except SyntaxError as exc:
        raise SpecError(path, [f"module {module_name!r} has a syntax error at {exc.filename}:{exc.lineno}: {exc.msg}; "
                               "fix the module"]) from exc
    except Exception as exc:  # the module's own code runs: anything it raises is the spec's problem to report
        log.warning("importing user-defined aggregate module %r failed", module_name, exc_info=True)
        raise SpecError(path, [f"importing {module_name!r} raised {type(exc).__name__}: {exc}; fix the module "
                               "(it runs when the spec is checked)"]) from exc
    cls = getattr(module, attr, None)
    if not isinstance(cls, type) or not issubclass(cls, AggregateFunction):
        raise SpecError(path, [f"{path!r} is not a subclass of spark_jobs.aggregates.AggregateFunction; "
                               "subclass it and implement create_accumulator, accumulate, merge and get_value"])
    return cls


_NO_RETRACT = ("cannot retract, so it cannot consume a changelog source's -U/-D rows (source.op_column); "
               "use count, sum, avg, min, max or count_distinct, or remove source.op_column")


def validate_aggregate(fn: str, columns: Sequence[str], args: Mapping[str, Any], schema: Mapping[str, str], *,
                       retracting: bool = False) -> list[tuple[str, str]]:
    """Problems with one spec entry as (field, message); ``retracting``: a changelog source, so it must retract."""
    if is_user_defined(fn):
        return _validate_user_defined(fn, columns, args, retracting=retracting)
    if (builtin := BUILTINS.get(fn)) is None:
        return [("fn", f"unknown function {fn!r}; use one of {', '.join(BUILTINS)} "
                       "or 'package.module:Class' for a user-defined aggregate")]
    problems = builtin.check_args(dict(args))
    if retracting and fn not in RETRACTING:
        problems.append(("fn", f"{fn} {_NO_RETRACT}"))
    if builtin.column_required and len(columns) != 1:
        problems.append(("column", f"{fn} needs exactly one column; add column: <name>"))
    elif not builtin.column_required and len(columns) > 1:
        problems.append(("columns", f"{fn} takes at most one column, got {list(columns)}"))
    if builtin.numeric_only and columns and schema.get(columns[0], "double") not in NUMERIC:
        problems.append(("column", f"{fn} needs a numeric column; {columns[0]!r} is {schema[columns[0]]}"))
    return problems


def _validate_user_defined(fn: str, columns: Sequence[str], args: Mapping[str, Any], *,
                           retracting: bool) -> list[tuple[str, str]]:
    try:
        cls = load_user_aggregate(fn)
    except SpecError as exc:
        return [("fn", exc.problems[0])]
    problems = []
    if retracting and cls.retract is AggregateFunction.retract:
        problems.append(("fn", f"{fn} does not implement retract: it {_NO_RETRACT}"))
    if cls.merge is AggregateFunction.merge:
        problems.append(("fn", f"{fn} does not implement merge; two-phase aggregation needs it"))
    if cls.accumulator_type is None or cls.result_type is None:
        problems.append(("fn", f"{fn} must set accumulator_type and result_type (pyarrow types)"))
    if cls.num_inputs is not None and len(columns) != cls.num_inputs:
        problems.append(("columns", f"{fn} takes {cls.num_inputs} column(s), got {list(columns)}"))
    try:
        cls(**dict(args))
    except Exception as exc:  # the user's __init__ runs: whatever it raises is reported as a bad args problem
        log.warning("user-defined aggregate %s rejected args %s", fn, dict(args), exc_info=True)
        problems.append(("args", f"{fn} does not accept args {dict(args)}: {type(exc).__name__}: {exc}"))
    return problems


def create(fn: str, *, name: str, columns: Sequence[str] = (), args: Mapping[str, Any] | None = None,
           input_type: str | None = None, retracting: bool = False) -> AggregateFunction[Any, Any]:
    """The aggregate object for a validated entry (its retracting form for a changelog source)."""
    if is_user_defined(fn):
        return load_user_aggregate(fn)(**dict(args or {}))
    cls: type[Builtin] = RETRACTING[fn] if retracting else BUILTINS[fn]
    return cls(name, columns, args, input_type)
