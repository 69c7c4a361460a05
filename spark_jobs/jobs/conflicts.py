"""Optimistic-concurrency retries: a job that loses a commit race re-plans and commits again. Delta commits are
optimistic: two writers plan from the same snapshot and the later commit fails when the earlier one removed files it
read (delta-rs checks coarsely: any concurrent remove). Nothing is written by the loser, so the job's whole
plan-and-commit step runs again from the new snapshot, where app transactions make work already done a no-op. The
wait before each attempt is "full jitter" exponential backoff, so racing writers spread out instead of colliding
again in lock step."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import TypeVar

from spark_jobs.errors import ConflictError, UsageError

__all__ = ["RetryPolicy", "retry_conflicts"]

log = logging.getLogger("spark_jobs")

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` in all (the first included); waits are uniform in [0, min(cap, base * 2**n)]."""

    attempts: int = 8
    base_s: float = 0.5
    cap_s: float = 15.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        raw = os.environ.get("SPARK_JOBS_COMMIT_ATTEMPTS")
        if raw is None:
            return cls()
        attempts = 0
        with suppress(ValueError):
            attempts = int(raw)
        if attempts < 1:
            raise UsageError(f"SPARK_JOBS_COMMIT_ATTEMPTS={raw!r} is not a positive whole number; "
                             "set it to e.g. 8, or unset it")
        return cls(attempts=attempts)


def retry_conflicts(step: Callable[[int], T], *, what: str, policy: RetryPolicy | None = None,
                    sleep: Callable[[float], None] = time.sleep, recheck: Callable[[], object] | None = None) -> T:
    """Run ``step(attempt)`` until it commits; on a :class:`ConflictError`, wait and run it again. ``step`` must plan
    from the tables as they are when it starts (never from state kept from an earlier attempt). ``recheck`` runs
    before each retry: a race lost to ``apply`` raises there (the spec changed) instead of re-planning. After
    ``policy.attempts`` lost races the last error is raised, saying how often it lost and what to do."""
    policy = policy or RetryPolicy.from_env()
    for attempt in range(1, policy.attempts + 1):
        try:
            if attempt > 1 and recheck is not None:
                recheck()
            return step(attempt)
        except ConflictError as exc:
            if attempt == policy.attempts:
                raise ConflictError(
                    f"{what} lost {attempt} commit races in a row and gave up: {exc}\n"
                    "Another writer keeps changing the same table. Run the writers of a table one at a time "
                    "(the Airflow DAGs share the pool aggregates_<pipeline> for that), or raise "
                    "SPARK_JOBS_COMMIT_ATTEMPTS; rerunning the job is safe") from exc
            wait = random.uniform(0, min(policy.cap_s, policy.base_s * 2 ** (attempt - 1)))
            log.warning("%s lost a commit race (attempt %d of %d): %s; re-planning from the new snapshot in %.1f s",
                        what, attempt, policy.attempts, str(exc).splitlines()[0], wait)
            sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover
