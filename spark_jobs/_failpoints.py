"""Named crash points for recovery tests: ``SPARK_JOBS_FAILPOINT=name`` kills the process there.

The kill is a real SIGKILL of the job's own process, so tests exercise exactly what a
machine crash or ``kill -9`` leaves behind, at a point chosen deterministically.
"""

from __future__ import annotations

import os
import signal

__all__ = ["failpoint"]


def failpoint(name: str) -> None:
    wanted = os.environ.get("SPARK_JOBS_FAILPOINT")
    if wanted and wanted == name:
        os.kill(os.getpid(), signal.SIGKILL)
