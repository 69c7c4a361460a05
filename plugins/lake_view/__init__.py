"""The lake web view: a FastAPI app over :mod:`spark_jobs.inspection`, mounted by Airflow's API server at ``/lake``."""
