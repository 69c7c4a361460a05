"""Read-only views of the lake (delta-rs only, no Spark), shared by the CLI and the web view."""

from spark_jobs.errors import InspectError
from spark_jobs.inspection.views import Series, list_tables, open_version, resolve_table
from spark_jobs.inspection.where import parse_where

__all__ = ["InspectError", "Series", "list_tables", "open_version", "parse_where", "resolve_table"]
