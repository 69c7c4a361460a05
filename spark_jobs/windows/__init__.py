"""Window kinds, one module each behind one protocol (:class:`WindowKind`): tumbling, hopping, cumulative, sessions,
and none. Every question a job asks of a window (how rows are assigned, what ``partials`` store, how stored rows
merge into served ones, which served rows a change reaches, when a window closes, how a spec change re-derives them,
how rollups bucket them) is a method of the kind; :func:`parse_window` alone reads which kind a spec declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_jobs.durations import Duration, parse_duration
from spark_jobs.windows.cumulative import Cumulative
from spark_jobs.windows.hopping import Hopping
from spark_jobs.windows.kind import BOUNDS, Reach, Stored, WindowChange, WindowKind
from spark_jobs.windows.session import Sessions
from spark_jobs.windows.tumbling import Tumbling
from spark_jobs.windows.unwindowed import Unwindowed

__all__ = ["BOUNDS", "Cumulative", "Hopping", "Reach", "Sessions", "Stored", "Tumbling", "Unwindowed", "WindowChange",
           "WindowKind", "parse_window"]

FIELDS = ("size", "slide", "step", "gap")
_FORMS = ("declare {size: 1 hour} (tumbling), {size: 1 hour, slide: 15 minutes} (hopping), {size: 1 day, step: "
          "1 hour} (cumulative) or {gap: 30 minutes} (sessions)")
Problems = list[tuple[str, str]]


def parse_window(raw: Any, *, retracting: bool = False) -> tuple[WindowKind | None, Problems]:
    """The kind a spec's ``window`` declares (``Unwindowed`` for none), or None; and the problems (field, message)."""
    if raw is None:
        return Unwindowed(), []
    if not isinstance(raw, Mapping):
        return None, [("window", f"expected a mapping with keys {', '.join(FIELDS)}, got {type(raw).__name__} "
                                 f"{raw!r}")]
    problems: Problems = [(f"window.{k}", f"unknown field; allowed fields are {', '.join(FIELDS)}")
                          for k in raw if k not in FIELDS]
    if "gap" in raw:
        kind = _sessions(raw, retracting, problems)
    elif raw.get("size") is None:
        problems.append(("window.size", f"is required: {_FORMS}"))
        kind = None
    else:
        kind = _fixed(raw, problems)
    return (kind if not problems else None), problems


def _durations(raw: Mapping[str, Any], names: tuple[str, ...], field: str, problems: Problems
               ) -> dict[str, Duration] | None:
    try:
        return {n: parse_duration(raw.get(n)) for n in names if n == names[0] or raw.get(n) is not None}
    except ValueError as exc:
        problems.append((field, str(exc)))
        return None


def _fixed(raw: Mapping[str, Any], problems: Problems) -> WindowKind | None:
    if raw.get("slide") is not None and raw.get("step") is not None:
        problems.append(("window", "'slide' and 'step' are mutually exclusive; define only one: slide for hopping "
                                   "windows, step for cumulative ones"))
        return None
    if (parsed := _durations(raw, ("size", "slide", "step"), "window", problems)) is None:
        return None
    size, slide, step = parsed["size"], parsed.get("slide"), parsed.get("step")
    for name, by in (("slide", slide), ("step", step)):
        if by is not None and by.seconds > size.seconds:
            problems.append((f"window.{name}", f"{name} {by} is longer than size {size}; use a {name} <= size"))
            return None
    if step is not None and size.seconds % step.seconds:
        problems.append(("window.step", f"step {step} does not divide size {size}; use a step that divides it, "
                                        "e.g. {size: 1 day, step: 1 hour}"))
        return None
    if step is not None and step != size:
        return Cumulative(size, step)
    return Hopping(size, slide) if slide is not None and slide != size else Tumbling(size)


def _sessions(raw: Mapping[str, Any], retracting: bool, problems: Problems) -> WindowKind | None:
    if "size" in raw or "slide" in raw:
        problems.append(("window", "a session window has a gap and no size or slide: {gap: 30 minutes}; or give a "
                                   "size for tumbling windows"))
        return None
    if (parsed := _durations(raw, ("gap",), "window.gap", problems)) is None:
        return None
    if retracting:  # a retraction may split a session, which no accumulator can undo
        problems.append(("window.gap", "session windows need an append-only source: source.op_column retracts rows, "
                                       "and retracting an event may split its session; drop op_column or use "
                                       "tumbling windows"))
        return None
    return Sessions(parsed["gap"])
