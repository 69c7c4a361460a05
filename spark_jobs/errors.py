"""Every exception the product raises on purpose, in one place: each message names the thing that is wrong, the bad
value and the fix; the CLI maps the classes to exit codes (see ``spark_jobs.cli``)."""

from __future__ import annotations

__all__ = ["PipelineError", "SpecError", "SpecChangedError", "UsageError", "InputError", "SchemaMismatchError",
           "LakeError", "ConflictError", "InspectError", "QualityError", "ComputeError", "RetractNotSupportedError",
           "MergeNotSupportedError"]


class PipelineError(Exception):
    """Base class: an expected failure with a message meant for the user."""

    exit_code = 1


class SpecError(PipelineError):
    """The pipeline spec is invalid; raised before any Spark work starts."""

    exit_code = 2

    def __init__(self, origin: str, problems: list[str]) -> None:
        self.origin = origin
        self.problems = list(problems)
        super().__init__(f"invalid pipeline spec {origin}:\n" + "\n".join(f"  - {p}" for p in self.problems))


class SpecChangedError(PipelineError):
    """The spec given is not the one the lake records (or a change of it is half applied): a job would
    write tables of two layouts. Exit code 2, before any work; ``plan`` shows the change, ``apply`` makes it."""

    exit_code = 2


class UsageError(PipelineError):
    """A bad command-line option, or the environment variable standing in for it (a malformed Spark master or
    Connect address, a port or argument out of range). Exit code 2, like a bad spec: nothing was read or
    written, and a retry cannot succeed until the option is fixed."""

    exit_code = 2


class InputError(PipelineError):
    """The input of a job is missing or unreadable (no partition, corrupt file)."""

    exit_code = 3


class SchemaMismatchError(InputError):
    """Input files do not carry the columns or types the spec declares."""


class LakeError(PipelineError):
    """A Delta table is missing, incompatible with the spec, or cannot be committed."""

    exit_code = 4


class ConflictError(LakeError):
    """Another writer committed to the table after this job read it, in a way this commit cannot
    ignore (it removed files this job read or replaces). Nothing was written; the job re-plans
    from the new snapshot and commits again, a bounded number of times (see ``jobs.conflicts``)."""


class InspectError(PipelineError):
    """A bad inspect request: unknown column, bad filter, version out of range, path outside the lake. Exit
    code 2, like a bad spec; a missing or unreadable table is a :class:`LakeError` (4). Nothing is ever written."""

    exit_code = 2


class QualityError(PipelineError):
    """A Great Expectations suite failed: the data is readable but not fit to publish. Exit code 5; the message
    lists the failed expectations and says where the full report is. A failed input gate has written nothing but
    the day's bad rows to ``dead_letter``; a failed pre-reduce outputs gate has rolled the day's partials back, so
    ``aggregates`` never sees them."""

    exit_code = 5


class ComputeError(PipelineError):
    """Spark cannot be reached or started: no Java, a Spark Connect server that is down, a port in use. Exit
    code 6: nothing was read or written, and a retry may succeed once the server is back (a malformed master or
    Connect address is a :class:`UsageError`, exit code 2)."""

    exit_code = 6


class RetractNotSupportedError(NotImplementedError):
    """The aggregate has no ``retract``: it cannot consume -U/-D rows."""


class MergeNotSupportedError(NotImplementedError):
    """The aggregate has no ``merge``: it cannot be split into combine and reduce phases."""
