"""Two-phase aggregation pipelines: accumulator algebra on Spark, Delta tables, Airflow DAGs."""

__version__ = "0.1.0"
