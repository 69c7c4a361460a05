"""Read-only views of the lake (delta-rs only, no Spark), shared by the CLI and the web view."""

from spark_jobs.inspect.views import TableRef, list_tables, resolve_table, show

__all__ = ["TableRef", "list_tables", "resolve_table", "show"]
