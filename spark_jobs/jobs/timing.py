"""Where a mini-batch's time goes: wall seconds and Spark jobs per phase. Each mini-batch keeps its phases in its
outcome and in its run record's message (``inspect runs``), so a slow batch can be read off the lake; ``benchmarks
stream`` prints the breakdown. Spark jobs are counted from the DAG scheduler's job counter of a classic session;
under Spark Connect they are not counted."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.spark_failures import spark_errors

__all__ = ["PhaseTimer"]


@dataclass
class PhaseTimer:
    """Seconds and Spark jobs per named phase; a phase timed twice adds up."""

    spark: Any = None
    seconds: dict[str, float] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the number of Spark jobs submitted so far, or None where it cannot be read (no JVM behind Spark Connect)
        self._jobs: Callable[[], int] | None = None
        with suppress(AttributeError, *spark_errors()):
            scheduler = self.spark.sparkContext._jsc.sc().dagScheduler()
            int(scheduler.nextJobId())
            self._jobs = lambda: int(scheduler.nextJobId())

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        jobs = self._jobs() if self._jobs is not None else None
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            if jobs is not None and self._jobs is not None:
                self.jobs[name] = self.jobs.get(name, 0) + self._jobs() - jobs

    def untrack_jobs(self) -> None:
        """Time the phases to come without counting jobs: they run beside other work, whose jobs they would count."""
        self._jobs = None

    def text(self) -> str:
        return ", ".join(f"{k} {v:.2f}s" + (f" ({self.jobs[k]} jobs)" if self.jobs.get(k) else "")
                         for k, v in self.seconds.items())
