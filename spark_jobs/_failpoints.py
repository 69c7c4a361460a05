"""Named crash points for recovery tests: ``SPARK_JOBS_FAILPOINT=name[@n]`` kills the process there.

``@n`` kills at the n-th time the point is reached (default the first), e.g. in the n-th
mini-batch of a stream.

The kill is a real SIGKILL of the job's own process, so tests exercise exactly what a
machine crash or ``kill -9`` leaves behind, at a point chosen deterministically.
"""

from __future__ import annotations

import os
import signal

__all__ = ["failpoint"]

_hits: dict[str, int] = {}


def failpoint(name: str) -> None:
    wanted = os.environ.get("SPARK_JOBS_FAILPOINT")
    if not wanted:
        return
    point, _, nth = wanted.partition("@")
    if point == name:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] == int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)
