"""The error of the inspect views: a request that cannot be answered as asked."""

from __future__ import annotations

from spark_jobs.errors import PipelineError

__all__ = ["InspectError"]


class InspectError(PipelineError):
    """A bad inspect request: unknown column, bad filter, version out of range, path outside the lake.

    Exit code 2 (bad arguments), like a bad spec; a table that is missing or unreadable is a
    :class:`spark_jobs.errors.LakeError` (exit code 4). Nothing is ever written either way.
    """

    exit_code = 2
