"""Built-in aggregates: each one is its algebra in Python and its two phases in Spark.

Adding a built-in is one module in this package, imported below, whose class subclasses ``Builtin``
and registers with ``@builtin`` (both from :mod:`spark_jobs.aggregates.builtin_base`): its algebra, its
stored columns (``acc_fields``, ``encode``/``decode``) and its Spark phases. The Python side
(``create_accumulator`` ... ``get_value``) is the reference, testable without Spark, and what
the stream's driver engine merges with. The Spark side compiles the same algebra to native expressions:
``spark_partial`` (combine: raw rows -> accumulator columns), ``spark_merge`` (reduce:
accumulator columns -> merged accumulator columns) and ``spark_value`` (accumulators ->
result). Accumulators are stored as plain columns: numbers as numbers, sets as arrays,
sketches as Apache DataSketches' standard serialized bytes (HLL_8, KLL doubles), so any
Delta reader can use them (:mod:`spark_jobs.aggregates.sketch_bytes` reads those bytes).

SQL NULL semantics: NULL inputs are ignored; an aggregate over no non-NULL input is NULL,
except the counts, which are 0.
"""

from __future__ import annotations

from spark_jobs.aggregates.builtin_base import ARROW_TYPES, BUILTINS, NUMERIC, RETRACTING, Builtin, builtin

# isort: off
# in registration order, which is the order of BUILTINS and RETRACTING (spec errors list BUILTINS' names)
from spark_jobs.aggregates.count import Count
from spark_jobs.aggregates.sum_avg import Avg, Sum
from spark_jobs.aggregates.extremes import Max, Min
from spark_jobs.aggregates.count_distinct import CountDistinct
from spark_jobs.aggregates.hll import ApproxCountDistinct
from spark_jobs.aggregates.kll import ApproxPercentile
from spark_jobs.aggregates.by_event_time import First, Last
from spark_jobs.aggregates.extremes_map_view import MaxMapView, MinMapView
# isort: on

__all__ = [
    "ARROW_TYPES", "BUILTINS", "NUMERIC", "RETRACTING", "ApproxCountDistinct", "ApproxPercentile", "Avg", "Builtin",
    "Count", "CountDistinct", "First", "Last", "Max", "MaxMapView", "Min", "MinMapView", "Sum", "builtin",
]
