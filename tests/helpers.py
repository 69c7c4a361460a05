"""Plain helpers that several test modules share: the repo's paths, free ports, stopping a process group, the
rollup the lake view must answer.

Fixtures stay in ``tests/conftest.py``; importing this module imports nothing heavy (no Spark, no Airflow, no
Arrow), so any test module or harness can use it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

    from spark_jobs.spec import PipelineSpec

__all__ = ["ROOT", "VENV_BIN", "direct_rollup", "free_port", "stop_process"]

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 30) -> None:
    """Stop a process started with ``start_new_session=True`` and its children: SIGTERM to the group, then SIGKILL.

    The group is signalled even when its leader has exited already, so no worker it left behind keeps a port.
    """
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


def direct_rollup(lake: str, spec: PipelineSpec, start: str, end: str, by: tuple[str, ...],
                  grain_s: int | None = None, where: str | None = None) -> pa.Table:
    """What the lake view's rollup must answer: :func:`spark_jobs.inspection.rollup.rollup` called directly on the
    latest ``<spec.name>.aggregates``, from ``start`` to ``end`` (``YYYY-MM-DD[ HH:MM]``, UTC)."""
    import datetime as dt

    from spark_jobs.inspection import open_version, resolve_table
    from spark_jobs.inspection.rollup import Rollup, rollup

    request = Rollup(dt.datetime.fromisoformat(start).replace(tzinfo=dt.UTC),
                     dt.datetime.fromisoformat(end).replace(tzinfo=dt.UTC), by, grain_s, where)
    return rollup(open_version(resolve_table(f"{spec.name}.aggregates", lake)), spec, request)
