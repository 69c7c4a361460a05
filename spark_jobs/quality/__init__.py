"""Great Expectations quality gates: suites built from a pipeline spec, run over Spark DataFrames.

``rules`` (thresholds, no Spark, no GX), ``suites`` (the expectations), ``gate`` (run a suite,
write its report, dead-letter rows a failed input gate rejects). The CLI entry is
``python -m spark_jobs validate``.
"""

from __future__ import annotations

__all__ = ["gate", "rules", "suites"]
