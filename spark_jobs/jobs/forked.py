"""Run a driver-side function over independent pieces of work on every core, in forked processes. The Arrow merges of
stored accumulators (sketch unions, a user's ``merge``) are Python loops that hold the GIL, so threads do not spread
them; forked workers do, and start in milliseconds with the parent's modules and state. A worker must not touch
delta-rs (its tokio runtime panics in a forked process): it reads data files with pyarrow
(:func:`spark_jobs.lake.arrow.read_data_files`) and returns Arrow tables, which it hands back as an Arrow IPC file in
shared memory that this process maps (pickling a table of sketches through the pool's pipe cost about as much as
merging it)."""

from __future__ import annotations

import gc
import glob
import multiprocessing
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

import pyarrow as pa

__all__ = ["cores", "forked_map"]

T = TypeVar("T")
R = TypeVar("R")

_LOCK = threading.Lock()
_TASK: Callable[[], list[tuple[int, Any]]] | None = None  # set before the workers fork: they inherit it, nothing is pickled
_SPILL_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
_SPILL_PREFIX = "spark_jobs-{}-"  # and the parent's pid


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def forked_map(fn: Callable[[T], R], items: Sequence[T], *, workers: int | None = None) -> list[R]:
    """``[fn(x) for x in items]`` on up to ``workers`` (every core) processes: this one and forked ones take the
    next item from a shared counter until none is left, so a slow piece or a late worker start delays no one.
    All in this process when ``workers`` is one, or off Linux (where forking a process with threads is unsafe).
    A worker's exception is raised here."""
    global _TASK
    count = min(workers or cores(), len(items))
    if count <= 1 or not sys.platform.startswith("linux") or not _LOCK.acquire(blocking=False):
        return [fn(x) for x in items]  # (or another thread's map is forking: one at a time)
    context = multiprocessing.get_context("fork")
    counter = context.Value("i", 0)

    def drain() -> list[tuple[int, Any]]:
        done: list[tuple[int, Any]] = []
        while True:
            with counter.get_lock():
                index = int(counter.value)
                counter.value = index + 1
            if index >= len(items):
                return done
            done.append((index, fn(items[index])))

    _TASK = drain
    gc.freeze()  # the workers' collections then skip the parent's objects: no copy-on-write of its heap
    try:
        with ProcessPoolExecutor(count - 1, mp_context=context) as pool:
            futures = [pool.submit(_run) for _ in range(count - 1)]
            out: dict[int, Any] = dict(drain())  # here, warm and with nothing to send back, while the workers run
            for future in futures:
                out.update((i, _mapped(r)) for i, r in future.result())
            return [out[i] for i in range(len(items))]
    finally:
        _TASK = None
        gc.unfreeze()
        _LOCK.release()
        for left in glob.glob(f"{_SPILL_DIR or tempfile.gettempdir()}/{_SPILL_PREFIX.format(os.getpid())}*"):
            os.unlink(left)  # the results of workers whose map failed


class _Spilled(str):
    """The path of the Arrow IPC file a worker wrote a table to."""


def _run() -> list[tuple[int, Any]]:
    assert _TASK is not None
    return [(i, _spilled(out)) for i, out in _TASK()]


def _spilled(out: Any) -> Any:
    if not isinstance(out, pa.Table):
        return out
    fd, path = tempfile.mkstemp(prefix=_SPILL_PREFIX.format(os.getppid()), suffix=".arrow", dir=_SPILL_DIR)
    with os.fdopen(fd, "wb") as sink, pa.ipc.new_file(sink, out.schema) as writer:
        writer.write_table(out)
    return _Spilled(path)


def _mapped(out: Any) -> Any:
    """A worker's result, its table mapped from the file it wrote (removed: the mapping keeps the pages)."""
    if not isinstance(out, _Spilled):
        return out
    try:
        return pa.ipc.open_file(pa.memory_map(out)).read_all()
    finally:
        os.unlink(out)
