"""Run a driver-side function over independent pieces of work on every core, in forked processes.

The Arrow merges of stored accumulators (sketch unions, a user's ``merge``) are Python loops that hold
the GIL, so threads do not spread them; forked workers do, and start in milliseconds with the parent's
modules and state. A worker must not touch delta-rs (its tokio runtime panics in a forked process):
it reads data files with pyarrow (:func:`spark_jobs.lake.arrow.read_data_files`) and returns Arrow tables.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

__all__ = ["cores", "forked_map"]

T = TypeVar("T")
R = TypeVar("R")

_LOCK = threading.Lock()
_TASK: Callable[[int], Any] | None = None  # set before the workers fork: they inherit it, nothing is pickled


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def forked_map(fn: Callable[[T], R], items: Sequence[T], *, workers: int | None = None) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``workers`` (every core) processes: this one takes the first item,
    forked ones the rest. All in this process when ``workers`` is one, or off Linux (where forking a
    process with threads is unsafe). A worker's exception is raised here."""
    global _TASK
    count = min(workers or cores(), len(items))
    if count <= 1 or not sys.platform.startswith("linux") or not _LOCK.acquire(blocking=False):
        return [fn(x) for x in items]  # (or another thread's map is forking: one at a time)
    _TASK = lambda i: fn(items[i])  # noqa: E731
    gc.freeze()  # the workers' collections then skip the parent's objects: no copy-on-write of its heap
    try:
        with ProcessPoolExecutor(count - 1, mp_context=multiprocessing.get_context("fork")) as pool:
            rest = pool.map(_run, range(1, len(items)))
            first = fn(items[0])  # here, warm and with nothing to send back, while the workers run
            return [first, *rest]
    finally:
        _TASK = None
        gc.unfreeze()
        _LOCK.release()


def _run(index: int) -> Any:
    assert _TASK is not None
    return _TASK(index)
