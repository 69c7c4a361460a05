"""A pipeline's aggregates bound to its spec: the combine and reduce phases, on Spark, in Arrow or on the driver."""

from spark_jobs.phases.compiled import CompiledAggregates, final_aggregate, partial_aggregate

__all__ = ["CompiledAggregates", "final_aggregate", "partial_aggregate"]
