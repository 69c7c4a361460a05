"""A small client of Airflow 3's REST API, for scripts that drive a local Airflow (``bin/demo``, ``benchmarks airflow``).

Why not the ``airflow`` CLI: each CLI call imports Airflow (2-3 s of CPU on these machines) and writes straight
into SQLite, which a running scheduler locks now and then; polling a backfill with it slows the very runs it waits
for. The REST API answers in milliseconds. ``wait`` prints each change of the runs' states, and has a bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["AirflowClient", "RunsNotFinished"]


class RunsNotFinished(TimeoutError):
    """The runs waited for did not all finish in time."""


@dataclass
class AirflowClient:
    url: str
    user: str
    password: str
    _token: str | None = field(default=None, repr=False)

    def _send(self, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
        request = urllib.request.Request(f"{self.url.rstrip('/')}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json", **headers})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        if self._token is None:
            login = {"username": self.user, "password": self.password}
            self._token = str(self._send("POST", "/auth/token", login, {})["access_token"])
        for attempt in range(5):  # SQLite behind the API answers "database is locked" now and then
            try:
                return self._send(method, path, body, {"Authorization": f"Bearer {self._token}"})
            except urllib.error.HTTPError as exc:
                if exc.code < 500 or attempt == 4:
                    raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc
            except OSError:
                if attempt == 4:
                    raise
            time.sleep(1 + attempt)
        raise AssertionError("unreachable")

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return list(self._request("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=1000")["dag_runs"])

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self._request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})

    def trigger(self, dag_id: str, run_id: str) -> None:
        self._request("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"dag_run_id": run_id, "logical_date": None, "conf": {}})

    def wait(self, dag_id: str, *, runs: int = 1, prefix: str = "", timeout: float = 900,
             on_change: Callable[[str], None] = print) -> list[dict[str, Any]]:
        """Wait until ``runs`` runs whose id starts with ``prefix`` exist and have all finished."""
        started = time.monotonic()
        seen = None
        while True:
            matching = [r for r in self.runs(dag_id) if r["dag_run_id"].startswith(prefix)]
            states = sorted(((r["logical_date"] or r["run_after"])[:10], r["state"]) for r in matching)
            if states != seen:
                on_change(f"  {time.monotonic() - started:5.0f}s {dag_id}: "
                          + (", ".join(f"{d} {s}" for d, s in states) or "no run yet"))
                seen = states
            if len(matching) >= runs and all(r["state"] in ("success", "failed") for r in matching):
                return matching
            if time.monotonic() - started > timeout:
                raise RunsNotFinished(f"{dag_id}: {len(matching)} runs ({prefix or 'any'}*) not all finished after "
                                      f"{timeout:.0f} s: {states}")
            time.sleep(2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_jobs.airflow_client", description=__doc__.split("\n")[0])
    parser.add_argument("url", help="Airflow API server, e.g. http://127.0.0.1:8080")
    parser.add_argument("user")
    parser.add_argument("password_file", help="JSON file {user: password} (simple auth manager)")
    parser.add_argument("action", choices=["wait", "pause", "unpause", "trigger"])
    parser.add_argument("dag_id")
    parser.add_argument("--runs", type=int, default=1, help="wait: how many runs must finish")
    parser.add_argument("--prefix", default="", help="wait: only runs whose id starts with this; trigger: the run id")
    parser.add_argument("--timeout", type=float, default=900, help="wait: seconds before giving up (default 900)")
    args = parser.parse_args(argv)
    client = AirflowClient(args.url, args.user, json.loads(Path(args.password_file).read_text())[args.user])
    if args.action in ("pause", "unpause"):
        client.set_paused(args.dag_id, args.action == "pause")
        return 0
    if args.action == "trigger":
        client.trigger(args.dag_id, args.prefix)
        return 0
    try:
        done = client.wait(args.dag_id, runs=args.runs, prefix=args.prefix, timeout=args.timeout,
                           on_change=lambda line: print(line, flush=True))
    except RunsNotFinished as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0 if all(r["state"] == "success" for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
