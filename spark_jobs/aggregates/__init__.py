"""The accumulator algebra: the contract, the built-ins and user-defined aggregates."""

from spark_jobs.aggregates.base import AggregateFunction
from spark_jobs.aggregates.builtins import BUILTINS, Builtin
from spark_jobs.aggregates.registry import load_user_aggregate, resolve, validate_aggregate

__all__ = ["BUILTINS", "AggregateFunction", "Builtin", "load_user_aggregate", "resolve", "validate_aggregate"]
