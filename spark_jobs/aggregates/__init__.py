"""The accumulator algebra: the contract, the built-ins and user-defined aggregates.

Nothing here knows the pipeline spec: :mod:`spark_jobs.phases` binds a spec's entries to these.
"""

from spark_jobs.aggregates.builtins import BUILTINS, Builtin
from spark_jobs.aggregates.contract import AggregateFunction
from spark_jobs.aggregates.registry import create, load_user_aggregate, validate_aggregate

__all__ = ["BUILTINS", "AggregateFunction", "Builtin", "create", "load_user_aggregate", "validate_aggregate"]
