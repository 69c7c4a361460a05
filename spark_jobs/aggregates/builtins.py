"""Built-in aggregates, a module each (imported below, registering with ``@builtin``): each is its Python algebra, the
reference the driver merges with, testable without Spark, and ``spark_partial`` (combine), ``spark_merge`` (reduce) and
``spark_value`` compiling it to Spark's native expressions. Accumulators are plain columns (numbers, arrays,
DataSketches' HLL_8 and KLL bytes) any Delta reader can use. SQL NULL semantics: NULL inputs are ignored; over no
non-NULL input an aggregate is NULL, the counts 0."""

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
from spark_jobs.aggregates.count_distinct_map_view import CountDistinctMapView
# isort: on

__all__ = ["ARROW_TYPES", "BUILTINS", "NUMERIC", "RETRACTING", "ApproxCountDistinct", "ApproxPercentile", "Avg",
           "Builtin", "Count", "CountDistinct", "CountDistinctMapView", "First", "Last", "Max", "MaxMapView", "Min",
           "MinMapView", "Sum", "builtin"]
