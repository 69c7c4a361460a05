"""Great Expectations quality gates: suites built from a pipeline spec, run over Spark DataFrames.

``thresholds`` (the bounds a pipeline's gates hold it to; no Spark, no GX), ``suites`` (the
expectations), ``gate`` (one :class:`~spark_jobs.quality.gate.Suite` per gate: run it, write its
report, dead-letter the rows a failed input gate rejects, roll back a failed day's partials). The CLI
entry is ``python -m spark_jobs validate``.
"""

from __future__ import annotations

__all__ = ["gate", "suites", "thresholds"]
