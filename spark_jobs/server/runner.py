"""The warm job runner: ``python -m spark_jobs`` commands in a pre-imported Python, one fork per job.

With the Spark Connect server the JVM stays warm, but each task still started a Python that imported pyspark's client,
pandas, pyarrow, delta-rs and, for every gate, Great Expectations (4-5 s of CPU on these machines, three times a day).
The runner imports them once and forks a child per job: the child is a fresh process (its own session, environment,
working directory, process group, exit code), so a job cannot disturb the runner or another job.

Protocol, over a Unix socket (private to the user that started it): the client sends one JSON line
``{"argv": [...], "env": {...}, "cwd": "..."}``; it receives the job's stdout and stderr as they are written, then
:data:`EXIT_MARK` and the exit code on a line. A client that disconnects (a killed Airflow task) gets its job's process
group sent SIGTERM.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from spark_jobs.errors import ComputeError

__all__ = ["EXIT_MARK", "run_job", "serve"]

EXIT_MARK = b"\x1espark_jobs-exit "
# What every job imports; a few seconds once here instead of in each job.
PRELOAD = ("pyarrow", "pyarrow.parquet", "pandas", "deltalake", "yaml",
           "pyspark.sql.connect.session", "pyspark.sql.connect.functions", "pyspark.sql.connect.dataframe",
           "great_expectations", "great_expectations.expectations", "spark_jobs.__main__", "spark_jobs.jobs.combine",
           "spark_jobs.jobs.reduce", "spark_jobs.quality.gate", "spark_jobs.lake._embedded",
           "spark_jobs.inspection.inspect_cli")
MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux


def serve(path: str | Path) -> None:
    """Listen on ``path`` until SIGTERM/SIGINT, then stop the running jobs (bounded) and return."""
    path = str(path)
    if len(path) > MAX_SOCKET_PATH:
        raise ComputeError(f"runner socket path is {len(path)} characters, over {MAX_SOCKET_PATH}: {path}; "
                           "use a shorter --state-dir")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    for module in PRELOAD:
        importlib.import_module(module)
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    listener = _listen(path)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    jobs: dict[int, socket.socket] = {}
    print(f"runner listening on {path} (pid {os.getpid()})", flush=True)
    try:
        while not stopping.is_set():
            for key, _ in selector.select(timeout=0.2):
                if key.data is None:
                    _accept(listener, selector, jobs)
                else:  # the client went away (or asked to stop): stop its job
                    selector.unregister(key.fileobj)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(key.data, signal.SIGTERM)
            _reap(selector, jobs)
    finally:
        _stop_jobs(selector, jobs)
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _listen(path: str) -> socket.socket:
    """A Unix socket at ``path`` that only this user can connect to (a stale one is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o077)
    try:
        listener.bind(path)
    finally:
        os.umask(old_umask)
    listener.listen(64)
    return listener


def _stop_jobs(selector: selectors.BaseSelector, jobs: dict[int, socket.socket], timeout: float = 30) -> None:
    """SIGTERM every running job; reap them for up to ``timeout`` seconds."""
    for pid in jobs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while jobs and time.monotonic() < deadline:
        _reap(selector, jobs)
        time.sleep(0.2)


def _accept(listener: socket.socket, selector: selectors.BaseSelector, jobs: dict[int, socket.socket]) -> None:
    conn, _ = listener.accept()
    conn.settimeout(10)  # a client that connects and says nothing cannot hold the runner
    try:
        if not (line := conn.makefile("rb").readline()):  # a readiness probe
            conn.close()
            return
        request = json.loads(line)
        argv, env, cwd = list(request["argv"]), dict(request["env"]), str(request["cwd"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        with contextlib.suppress(OSError):
            conn.sendall(f"error: bad runner request: {exc}\n".encode() + EXIT_MARK + b"2\n")
        conn.close()
        return
    conn.settimeout(None)
    if (pid := os.fork()) == 0:  # the job
        listener.close()
        for other in jobs.values():
            other.close()
        _run_child(conn, argv, env, cwd)
    jobs[pid] = conn
    selector.register(conn, selectors.EVENT_READ, pid)


def _run_child(conn: socket.socket, argv: list[str], env: dict[str, str], cwd: str) -> None:
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(conn.fileno(), 1)
        os.dup2(conn.fileno(), 2)
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, errors="replace")
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, errors="replace")
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        from spark_jobs.cli import main

        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # the job's boundary: whatever it raised, its client gets the traceback and exit code 1
        traceback.print_exc()
    finally:
        with contextlib.suppress(OSError, ValueError):  # the client hung up, or the stream is closed
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reap(selector: selectors.BaseSelector, jobs: dict[int, socket.socket]) -> None:
    while jobs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if (conn := jobs.pop(pid, None)) is None:
            continue
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(conn)
        with contextlib.suppress(OSError):
            conn.sendall(EXIT_MARK + f"{os.waitstatus_to_exitcode(status)}\n".encode())
        conn.close()


def run_job(path: str | Path, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None,
            on_line: Callable[[str], None] = print, on_start: Callable[[socket.socket], None] | None = None) -> int:
    """Run ``python -m spark_jobs <argv>`` in the runner at ``path``, streaming its lines; its exit code. Shutting down
    the connection ``on_start`` gets stops the job (the runner SIGTERMs it)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
    except OSError as exc:
        conn.close()
        raise ComputeError(f"no spark_jobs runner answers at {path} ({exc.strerror or exc}); start it with "
                           "`python -m spark_jobs server start`, or unset SPARK_JOBS_RUNNER") from exc
    with conn:
        if on_start is not None:
            on_start(conn)
        conn.sendall(json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd or os.getcwd()}).encode() + b"\n")
        for raw in conn.makefile("rb"):
            before, mark, rest = raw.partition(EXIT_MARK)
            text = before.decode(errors="replace").rstrip("\n")
            if text or not mark:
                on_line(text)
            if mark:
                return int(rest.strip() or 1)
    raise ComputeError(f"the spark_jobs runner at {path} closed the connection before the job ended "
                       "(was it stopped?); run the task again")


def probe(path: str | Path) -> bool:
    """True when a runner accepts connections at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn, contextlib.suppress(OSError):
        conn.connect(str(path))
        return True
    return False


if __name__ == "__main__":  # python -m spark_jobs.server.runner SOCKET: what `server start` runs
    serve(sys.argv[1])
