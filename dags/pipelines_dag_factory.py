"""DAGs generated from the pipeline specs in ``pipelines/*.yaml`` (or ``*.yml``): wiring only.

For each spec ``<name>``: ``<name>_batch`` (daily, one run per event date) and ``<name>_stream`` (every 5
minutes: the streaming job in available-now mode, then reduce and validate); and one ``lake_maintenance`` DAG
over all pipelines. The work is in ``spark_jobs`` (the CLI the operator submits) and ``plugins/spark_jobs_airflow``.
Parsing this file imports no pyspark and no Great Expectations: it checks each spec as the jobs would
(``spark_jobs.spec``, pure Python). A spec that does not load (bad YAML, a field the jobs would refuse, a name
another spec took) gets no DAGs here; ``pipeline_specs_check.py`` puts it among Airflow's import errors with
its file and message, and every other spec's DAGs are built and scheduled as usual.

Settings (environment):
    SPARK_JOBS_PIPELINES   folder of the specs (default: the repo's ``pipelines/``)
    SPARK_JOBS_START_DATE  first event date of the batch DAGs (default 2024-03-01)
    SPARK_JOBS_END_DATE    last event date the scheduler may schedule (default: none); bin/demo and the tests
                           set it to the sample data's last day, so no run waits for a day that never comes
    SPARK_JOBS_CATCHUP     "true": a run for every day since the start date (default false; ``airflow
                           backfill create`` works either way)
    SPARK_JOBS_STREAM_SCHEDULE  cron of the stream DAG (default ``*/5 * * * *``); "none": triggered runs only

The tasks that write a pipeline's ``aggregates`` (batch ``reduce``, stream ``stream`` and ``reduce``) share
the one-slot pool ``aggregates_<name>``, which must exist: ``airflow pools set aggregates_<name> 1 "writers of
<name>.aggregates"`` (bin/demo does it). A commit that races anyway (a job started outside Airflow) is retried
inside the job. The Spark work runs on the Spark Connect server of the connection ``spark_connect_default`` or
``$SPARK_REMOTE`` when one is set, else through ``spark-submit`` per task (``plugins/spark_jobs_airflow``).
"""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG, Asset, CronDataIntervalTimetable, Param, task
from spark_jobs_airflow import DATE, LandingPartitionSensor, SparkJobOperator, aggregates_pool, load_specs, specs_folder
from spark_jobs_airflow.conditions import skip_unchanged_day

from spark_jobs.spec import PipelineSpec, load_spec

START = dt.datetime.fromisoformat(os.environ.get("SPARK_JOBS_START_DATE", "2024-03-01")).replace(tzinfo=dt.UTC)
END = (dt.datetime.fromisoformat(os.environ["SPARK_JOBS_END_DATE"]).replace(tzinfo=dt.UTC)
       if os.environ.get("SPARK_JOBS_END_DATE") else None)
CATCHUP = os.environ.get("SPARK_JOBS_CATCHUP", "false").lower() in ("1", "true", "yes")
STREAM_SCHEDULE = os.environ.get("SPARK_JOBS_STREAM_SCHEDULE", "*/5 * * * *")
DEFAULT_ARGS = {"owner": "spark_jobs", "retries": 1, "retry_delay": dt.timedelta(seconds=30)}


def batch_dag(spec: PipelineSpec) -> DAG:
    name, pipeline = spec.name, spec.origin
    asset = Asset(name=f"{name}.aggregates", uri=f"file://{spec.lake}/{name}/aggregates")
    with DAG(
        dag_id=f"{name}_batch",
        description=f"{name}: wait for a landing day, validate, combine, reduce, validate, publish",
        # one run per event date, after the day is over: the logical date is the day processed
        schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
        start_date=START, end_date=END, catchup=CATCHUP, max_active_runs=2, default_args=DEFAULT_ARGS,
        params={
            "force_recombine": Param(False, type="boolean", description="combine the day even if unchanged"),
            "date": Param(None, type=["null", "string"], format="date",
                          description="event date YYYY-MM-DD (default: the run's logical date)"),
        },
        tags=["spark_jobs", name, "batch"], doc_md=__doc__,
    ) as dag:
        wait = LandingPartitionSensor(task_id="wait_for_landing", pipeline=pipeline, date=DATE,
                                      poke_interval=60, timeout=6 * 3600)
        validate_input = SparkJobOperator(task_id="validate_input", retries=0,
                                          args=["validate", "--pipeline", pipeline, "--suite", "input", "--date", DATE])
        combine = SparkJobOperator(task_id="combine", args=["combine", "--pipeline", pipeline, "--date", DATE],
                                   skip_if=skip_unchanged_day(pipeline))
        validate_partials = SparkJobOperator(task_id="validate_partials", retries=0, trigger_rule="none_failed",
                                             args=["validate", "--pipeline", pipeline, "--suite", "outputs",
                                                   "--date", DATE])
        # the writers of the serving table, in both DAGs, queue on one pool slot instead of racing
        reduce = SparkJobOperator(task_id="reduce", args=["reduce", "--pipeline", pipeline], pool=aggregates_pool(name))
        validate_outputs = SparkJobOperator(task_id="validate_outputs", retries=0,
                                            args=["validate", "--pipeline", pipeline, "--suite", "outputs"])

        @task(task_id="publish", outlets=[asset])
        def publish(*, outlet_events=None) -> dict:
            """Announce the validated serving table: an Asset event carrying its Delta version."""
            from spark_jobs.lake.reader import open_table

            path = asset.uri.removeprefix("file://")
            table = open_table(path)
            extra = {"version": table.version(), "files": table.num_files(), "path": path}
            if outlet_events is not None:
                outlet_events[asset].extra = extra
            return extra

        wait >> validate_input >> combine >> validate_partials >> reduce >> validate_outputs >> publish()
    return dag


def stream_dag(spec: PipelineSpec) -> DAG:
    name, pipeline = spec.name, spec.origin
    with DAG(
        dag_id=f"{name}_stream",
        description=f"{name}: the streaming job in available-now mode, reduce, validate",
        schedule=None if STREAM_SCHEDULE.lower() == "none" else STREAM_SCHEDULE,
        start_date=START, catchup=False, max_active_runs=1, default_args=DEFAULT_ARGS,
        is_paused_upon_creation=True,  # unpause to start streaming
        tags=["spark_jobs", name, "stream"],
    ) as dag:
        stream = SparkJobOperator(task_id="stream", args=["stream", "--pipeline", pipeline, "--available-now"],
                                  pool=aggregates_pool(name))
        reduce = SparkJobOperator(task_id="reduce", args=["reduce", "--pipeline", pipeline], pool=aggregates_pool(name))
        validate = SparkJobOperator(task_id="validate_outputs", retries=0,
                                    args=["validate", "--pipeline", pipeline, "--suite", "outputs"])
        stream >> reduce >> validate
    return dag


def maintenance_dag(specs: list[PipelineSpec]) -> DAG:
    with DAG(
        dag_id="lake_maintenance", schedule="@daily", tags=["spark_jobs", "maintenance"],
        description="compact small files, vacuum (168 h retention), checkpoint: every pipeline's tables",
        start_date=START, catchup=False, max_active_runs=1, is_paused_upon_creation=True, default_args=DEFAULT_ARGS,
    ) as dag:
        for spec in specs:
            @task(task_id=f"maintain_{spec.name}")
            def maintain(pipeline: str = spec.origin) -> list[str]:
                """Compact, vacuum and checkpoint through delta-rs (no Spark)."""
                from spark_jobs.lake.maintenance import maintain as run_maintenance

                loaded = load_spec(pipeline)
                return [entry.summary() for entry in run_maintenance(loaded.lake, loaded.name)]

            maintain()
    return dag


SPECS, _ = load_specs(specs_folder())  # the broken ones are pipeline_specs_check.py's import error
for _spec in SPECS:
    globals()[f"{_spec.name}_batch"] = batch_dag(_spec)
    globals()[f"{_spec.name}_stream"] = stream_dag(_spec)
lake_maintenance = maintenance_dag(SPECS)
