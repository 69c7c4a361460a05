"""Read-only views of the lake (delta-rs only, no Spark), shared by the CLI and the web view."""

from spark_jobs.errors import InspectError
from spark_jobs.inspection.views import (
    LAKE_ENV,
    Series,
    TableDiff,
    TableRef,
    default_lake,
    diff,
    history,
    list_tables,
    open_version,
    partitions,
    resolve_table,
    runs,
    schema,
    series,
    show,
    table_keys,
    versions,
)
from spark_jobs.inspection.where import parse_where

__all__ = [
    "LAKE_ENV",
    "InspectError",
    "Series",
    "TableDiff",
    "TableRef",
    "default_lake",
    "diff",
    "history",
    "list_tables",
    "open_version",
    "parse_where",
    "partitions",
    "resolve_table",
    "runs",
    "schema",
    "series",
    "show",
    "table_keys",
    "versions",
]
