"""Airflow operators and sensors for spark_jobs pipelines (imported by the DAG factory in ``dags/``).

Importing this package imports no pyspark: operators and sensors store their arguments in
``__init__`` and do their work (a job on the Spark Connect server or through ``spark-submit``, a
file or Delta log check) in ``execute``/``poke``.
"""

from __future__ import annotations

from spark_jobs_airflow.operators import DATE, SparkJobError, SparkJobOperator
from spark_jobs_airflow.pipelines import BrokenPipelineSpecs, aggregates_pool, load_specs, specs_folder
from spark_jobs_airflow.sensors import DeltaVersionSensor, LandingPartitionSensor

__all__ = ["DATE", "BrokenPipelineSpecs", "DeltaVersionSensor", "LandingPartitionSensor", "SparkJobError",
           "SparkJobOperator", "aggregates_pool", "load_specs", "specs_folder"]
