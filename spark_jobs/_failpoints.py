"""Named points for recovery and race tests. ``SPARK_JOBS_FAILPOINT=name[@n]`` kills the process at the n-th time the
point is reached (default the first), e.g. in the n-th mini-batch of a stream: a real SIGKILL of the job's own
process, so tests exercise exactly what a machine crash or ``kill -9`` leaves behind, at a point chosen
deterministically. In the same process, a test may instead run an action once at a point (:func:`once_at`), e.g. a
concurrent writer's commit between a job's plan and its own commit."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["failpoint", "once_at"]

_hits: dict[str, int] = {}
_actions: dict[str, Callable[[], object]] = {}


def failpoint(name: str) -> None:
    action = _actions.pop(name, None)
    if action is not None:
        action()
    point, _, nth = os.environ.get("SPARK_JOBS_FAILPOINT", "").partition("@")
    if point == name:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] == int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def once_at(name: str, action: Callable[[], object]) -> Iterator[Callable[[], bool]]:
    """Run ``action`` the first time ``name`` is reached inside the block; yields "has it run"."""
    _actions[name] = action
    try:
        yield lambda: name not in _actions
    finally:
        _actions.pop(name, None)
