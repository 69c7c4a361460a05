"""Spans of time as specs write them (``'1 hour'``, ``'90 s'``), parsed once and kept in seconds; instants made UTC."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Duration", "parse_duration", "utc"]

T = TypeVar("T")

_DURATION = re.compile(
    r"^\s*(\d+)\s*(s|sec|secs|second|seconds|m|min|mins|minute|minutes|h|hour|hours|d|day|days|w|week|weeks)\s*$"
)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True)
class Duration:
    """A positive span of time, kept in seconds; ``spark`` renders Spark's interval text."""

    seconds: int

    @property
    def spark(self) -> str:
        return f"{self.seconds} seconds"

    @property
    def micros(self) -> int:
        return self.seconds * 1_000_000

    def __str__(self) -> str:
        for unit, size in (("week", 604800), ("day", 86400), ("hour", 3600), ("minute", 60)):
            if self.seconds % size == 0:
                n = self.seconds // size
                return f"{n} {unit}{'s' if n != 1 else ''}"
        return f"{self.seconds} seconds"


def parse_duration(text: object) -> Duration:
    """Parse ``'1 hour'``, ``'90 s'``, ``'10 minutes'``; raise ValueError with the accepted forms."""
    match = _DURATION.match(str(text)) if isinstance(text, (str, int)) else None
    if not match or int(match.group(1)) <= 0:
        raise ValueError(
            f"bad duration {text!r}; write a positive whole number and a unit, "
            "e.g. '30 seconds', '10 minutes', '1 hour', '1 day', '1 week'"
        )
    return Duration(int(match.group(1)) * _UNIT_SECONDS[match.group(2)[0]])  # each unit's first letter names it


def utc(value: T) -> T:
    """A datetime in UTC: Spark hands timestamps back naive, in the driver's local zone (which ``astimezone``
    assumes of a naive one); anything else as it is."""
    return value.astimezone(dt.UTC) if isinstance(value, dt.datetime) else value  # type: ignore[return-value]
