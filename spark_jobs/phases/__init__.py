"""A pipeline's aggregates bound to its spec: the combine and reduce phases, on Spark or on the driver."""

from spark_jobs.phases.compiled import CompiledAggregates, assign_windows, final_aggregate, partial_aggregate, with_sign

__all__ = ["CompiledAggregates", "assign_windows", "final_aggregate", "partial_aggregate", "with_sign"]
