"""The spark_jobs server: a Spark Connect server (warm JVM) and a job runner (warm Python).

Short jobs (an Airflow DAG run's tasks, a backfill's runs, the gates) reach them instead of each
starting a cold Spark application; ``python -m spark_jobs server start|stop|status`` manages both.
"""
