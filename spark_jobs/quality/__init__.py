"""Great Expectations quality gates over Spark DataFrames (``python -m spark_jobs validate``): ``thresholds`` (the
bounds a pipeline's gates hold it to; no Spark, no GX), ``suites`` (the expectations a spec implies) and ``gate`` (one
:class:`~spark_jobs.quality.gate.Suite` per gate: run it, write its report, act on its verdict in the lake)."""
