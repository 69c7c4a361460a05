"""A long-lived background process (the Connect server, the warm runner, a standalone cluster's parts) with a pid
file and a log: started in its own process group, so a stop reaches everything it starts, and never waited for
without a bound and a message."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.errors import ComputeError

__all__ = ["Background"]


@dataclass(frozen=True)
class Background:
    """One background process, known by the pid file ``<state_dir>/<name>.pid``."""

    name: str
    state_dir: Path

    @property
    def pid_file(self) -> Path:
        return self.state_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.state_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        """The pid of the running process, None when it is not running (a stale pid file is removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        if not _alive(pid):
            self.pid_file.unlink(missing_ok=True)
            return None
        return pid

    def start(self, command: Sequence[str], *, env: Mapping[str, str], ready: Callable[[], bool],
              timeout: float) -> int:
        """Start ``command`` and wait until ``ready()``; on a timeout or an early exit, stop it and raise."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            proc = subprocess.Popen(list(command), env=dict(env), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.pid_file.write_text(f"{proc.pid}\n")
        deadline = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise ComputeError(f"the {self.name} exited with code {proc.returncode} while starting; "
                                   f"its log {self.log_file} ends with:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ComputeError(f"the {self.name} was not ready after {timeout:.0f} s and was stopped; "
                                   f"its log {self.log_file} ends with:\n{self.tail()}")
            time.sleep(0.2)
        return proc.pid

    def stop(self, timeout: float = 30) -> bool:
        """SIGTERM the process group, SIGKILL it after ``timeout``; False when nothing was running."""
        if (pid := self.pid()) is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie child of this process counts as gone)."""
    with contextlib.suppress(ChildProcessError):  # not this process's child
        if os.waitpid(pid, os.WNOHANG)[0]:
            return False
    try:
        with contextlib.suppress(PermissionError):  # another user's: it runs
            os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
