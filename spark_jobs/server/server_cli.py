"""``python -m spark_jobs server start|stop|status|run``: the Spark Connect server and the warm runner."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from spark_jobs.cli import parse_confs
from spark_jobs.errors import ComputeError
from spark_jobs.server.connect import ConnectServer
from spark_jobs.server.process import Background
from spark_jobs.server.runner import MAX_SOCKET_PATH, probe

__all__ = ["add_server_parser", "run_server"]

RUNNER_SOCKET = "runner.sock"  # in the state dir


def add_server_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("server", help="start, stop or check the Spark Connect server and the warm job runner "
                                      "that jobs and Airflow tasks share")
    p.add_argument("action", choices=["start", "stop", "status", "run"],
                   help="start both in the background, stop them, say whether they run, or run the Connect "
                        "server in the foreground (containers)")
    p.add_argument("--state-dir", default=os.environ.get("SPARK_JOBS_STATE_DIR", ".spark_jobs"),
                   help="pid files, logs and the runner's socket (default $SPARK_JOBS_STATE_DIR or .spark_jobs)")
    p.add_argument("--host", default="127.0.0.1", help="address the Connect server listens on (default 127.0.0.1; "
                                                       "0.0.0.0 in a container)")
    p.add_argument("--port", type=int, default=15002, help="Connect server port (default 15002)")
    p.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[*]"),
                   help="where the server's Spark runs (default $SPARK_MASTER or local[*]; spark://host:7077 "
                        "for a standalone cluster)")
    p.add_argument("--driver-memory", default=os.environ.get("SPARK_DRIVER_MEMORY", "2g"),
                   help="the server's driver memory (default $SPARK_DRIVER_MEMORY or 2g)")
    p.add_argument("--shuffle-partitions", type=int, default=None,
                   help="default spark.sql.shuffle.partitions (default: two per core of a local master, at least 8; "
                        "on a cluster 200, coalesced by adaptive execution to the cores its executors offer)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting of the server's application (repeatable), e.g. spark.driver.host=h")
    p.add_argument("--no-runner", action="store_true", help="start the Connect server only")
    p.add_argument("--json", action="store_true", help="status: one JSON object for scripts")
    p.add_argument("--timeout", type=float, default=180, help="seconds to wait for each part to be ready (default 180)")
    return p


def run_server(args: argparse.Namespace) -> int:
    state = Path(args.state_dir).resolve()
    # a bad --conf, --port, --master or --shuffle-partitions is a UsageError
    server = ConnectServer(state, host=args.host, port=args.port, master=args.master,
                           driver_memory=args.driver_memory, shuffle_partitions=args.shuffle_partitions,
                           extra=parse_confs(args.conf))
    runner = Background("runner", state)
    if args.action == "run":
        os.execve(server.command()[0], server.command(), server.environment())
    if args.action == "stop":
        stopped = [name for name, proc in (("runner", runner), ("Connect server", server.process)) if proc.stop()]
        print(f"stopped {' and '.join(stopped)}" if stopped else f"nothing was running (state dir {state})")
        return 0
    if args.action == "status":  # exit code 1 while the server is down
        up, socket_path = server.running(), state / RUNNER_SOCKET
        runner_up = runner.pid() is not None and probe(socket_path)
        if args.json:
            print(json.dumps({"connect": {"up": up, "url": server.url, "pid": server.process.pid() if up else None},
                              "runner": {"up": runner_up, "socket": str(socket_path),
                                         "pid": runner.pid() if runner_up else None},
                              "state_dir": str(state)}))
        else:
            print(f"Connect server: {'up at ' + server.url if up else 'down'} (state dir {state})")
            print(f"runner: {'up at ' + str(socket_path) if runner_up else 'down'}")
        return 0 if up else 1
    started = time.monotonic()
    pid = server.start(timeout=args.timeout)
    print(f"Spark Connect server: {server.url} (pid {pid}, master {args.master}, log {server.process.log_file}), "
          f"ready after {time.monotonic() - started:.1f} s", flush=True)
    exports = {"SPARK_REMOTE": server.url}
    if not args.no_runner:
        exports["SPARK_JOBS_RUNNER"] = str(_start_runner(runner, server, state, timeout=args.timeout))
    print("jobs and Airflow tasks use them with: export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in exports.items()))
    return 0


def _start_runner(runner: Background, server: ConnectServer, state: Path, *, timeout: float) -> Path:
    """Start the warm job runner on the server (unless one answers already); its socket path."""
    socket_path = state / RUNNER_SOCKET
    if len(str(socket_path)) > MAX_SOCKET_PATH:
        raise ComputeError(f"runner socket path {socket_path} is over {MAX_SOCKET_PATH} characters; "
                           "use a shorter --state-dir")
    started = time.monotonic()
    if runner.pid() is None or not probe(socket_path):
        runner.stop()
        env = {**os.environ, "SPARK_REMOTE": server.url, "GX_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
        runner.start([sys.executable, "-m", "spark_jobs.server.runner", str(socket_path)], env=env,
                     timeout=timeout, ready=lambda: probe(socket_path))
    print(f"warm job runner: {socket_path} (pid {runner.pid()}, log {runner.log_file}), "
          f"ready after {time.monotonic() - started:.1f} s", flush=True)
    return socket_path
