"""Benchmarks of the spark_jobs pipelines, not tests: ``python -m benchmarks batch|stream|airflow``.

Run from the repository root; not part of the installed ``spark_jobs`` distribution. See docs/benchmarks.md.
"""
