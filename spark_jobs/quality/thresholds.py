"""Thresholds of a pipeline's quality gates: defaults, overridden by ``expectations/<name>.yaml``.

The file sits next to the pipeline spec (``pipelines/expectations/page_views.yaml`` for ``pipelines/page_views.yaml``),
outside the ``pipelines/*.yaml`` glob so it is never read as a spec. Imports no pyspark and no Great Expectations: the
DAG factory may read it at parse time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spark_jobs.errors import SpecError

__all__ = ["QualityRules", "Range", "load_rules"]


@dataclass(frozen=True)
class Range:
    """Inclusive bounds for a column's values; ``None`` is unbounded. ``mostly`` is the share that must hold."""

    min: float | None = None
    max: float | None = None
    mostly: float = 1.0

    def describe(self) -> str:
        return f"[{'-inf' if self.min is None else f'{self.min:g}'}, {'+inf' if self.max is None else f'{self.max:g}'}]"


@dataclass(frozen=True)
class QualityRules:
    """What the input and outputs suites check, beyond what the spec itself implies."""

    max_rejected_fraction: float = 0.01
    min_rows: int = 1
    input_ranges: dict[str, Range] = field(default_factory=dict)
    output_ranges: dict[str, Range] = field(default_factory=dict)

    @property
    def mostly(self) -> float:
        """The share of rows that must pass the row-level input checks."""
        return 1.0 - self.max_rejected_fraction


def _ranges(raw: Any, where: str, problems: list[str]) -> dict[str, Range]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping column -> {{min, max, mostly}}, got {raw!r}")
        return {}
    out: dict[str, Range] = {}
    for col, bounds in raw.items():
        if not isinstance(bounds, dict) or set(bounds) - {"min", "max", "mostly"}:
            problems.append(f"{where}.{col}: expected {{min: N, max: N, mostly: 0..1}}, got {bounds!r}")
            continue
        lo, hi, mostly = bounds.get("min"), bounds.get("max"), bounds.get("mostly", 1.0)
        if lo is not None and hi is not None and lo > hi:
            problems.append(f"{where}.{col}: min {lo} is above max {hi}; swap them")
        if not 0 < float(mostly) <= 1:
            problems.append(f"{where}.{col}.mostly: {mostly} is not in (0, 1]")
        out[str(col)] = Range(lo, hi, float(mostly))
    return out


def load_rules(spec_path: str | Path | None, name: str) -> QualityRules:
    """The rules for pipeline ``name``: the file next to its spec when there is one, else defaults."""
    path = None if spec_path is None else Path(spec_path).resolve().parent / "expectations" / f"{name}.yaml"
    if path is None or not path.is_file():
        return QualityRules()
    raw = yaml.safe_load(path.read_text()) or {}
    problems: list[str] = []
    if unknown := set(raw) - {"input", "outputs"}:
        problems.append(f"{sorted(unknown)}: unknown sections; allowed are input, outputs")
    inp, outp = raw.get("input") or {}, raw.get("outputs") or {}
    if unknown_in := set(inp) - {"max_rejected_fraction", "min_rows", "ranges"}:
        problems.append(f"input.{sorted(unknown_in)}: unknown fields; allowed are max_rejected_fraction, min_rows, "
                        "ranges")
    fraction = float(inp.get("max_rejected_fraction", 0.01))
    if not 0 <= fraction < 1:  # NaN too
        problems.append(f"input.max_rejected_fraction: {fraction} is not in [0, 1)")
    rules = QualityRules(max_rejected_fraction=fraction, min_rows=int(inp.get("min_rows", 1)),
                         input_ranges=_ranges(inp.get("ranges"), "input.ranges", problems),
                         output_ranges=_ranges(outp.get("ranges"), "outputs.ranges", problems))
    if problems:
        raise SpecError(str(path), problems)
    return rules
