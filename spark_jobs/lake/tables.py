"""Where a pipeline's tables live and what they are called."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

__all__ = ["SPEC_SHAPED", "TABLES", "TableName", "PipelineTables", "is_spec_shaped", "is_table_name"]

TableName = Literal["partials", "aggregates", "changelog", "dead_letter", "runs", "specs"]
TABLES: tuple[TableName, ...] = ("partials", "aggregates", "changelog", "dead_letter", "runs", "specs")
SPEC_SHAPED = ("partials", "aggregates", "changelog", "state")  # and rollups: their columns follow the spec
_ROLLUP = re.compile(r"rollup_[a-z][a-z0-9_]*")  # a declared rollup's table


def is_table_name(table: str) -> bool:
    """One of the pipeline's tables, or a declared rollup's ``rollup_<name>``."""
    return table in TABLES or _ROLLUP.fullmatch(table) is not None


def is_spec_shaped(path: str) -> bool:
    """Whether the table at ``path`` has columns that follow the spec (its writers carry ``<pipeline>.spec``)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return name in SPEC_SHAPED or _ROLLUP.fullmatch(name) is not None


@dataclass(frozen=True)
class PipelineTables:
    """The paths of a pipeline's Delta tables (:data:`TABLES`, ``specs``: see ``lake.spec_record``) under the lake."""

    lake: str
    pipeline: str

    def path(self, table: str) -> str:
        return f"{self.lake.rstrip('/')}/{self.pipeline}/{table}"

    def __getattr__(self, table: str) -> str:
        if table in TABLES:
            return self.path(table)
        raise AttributeError(f"{type(self).__name__} has no table {table!r}")

    if TYPE_CHECKING:  # the tables' paths, as __getattr__ gives them
        partials: ClassVar[str]
        aggregates: ClassVar[str]
        changelog: ClassVar[str]
        dead_letter: ClassVar[str]
        runs: ClassVar[str]
        specs: ClassVar[str]

    def rollup(self, name: str) -> str:
        return self.path(f"rollup_{name}")

    @property
    def stream_state(self) -> str:
        """The stream's keyed state (a Delta table of open windows' accumulators), internal."""
        return self.path("_stream/state")

    @property
    def stream_checkpoint(self) -> str:
        """Spark's checkpoint of the stream: which landing files each mini-batch id holds."""
        return self.path("_stream/checkpoint")
