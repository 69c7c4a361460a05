"""Sample page-view events: Zipf-skewed users and pages, a daily traffic curve, NULLs and a few bad records,
hive-partitioned by ``event_date``, deterministic for a seed; written with numpy and pyarrow straight to files (no
Spark), so 10M rows take seconds."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["GenerateConfig", "GenerateResult", "generate", "day_table"]

Format = Literal["parquet", "json", "csv"]
COUNTRIES = np.array(["US", "DE", "IN", "BR", "GB", "FR", "JP", "NG", "CA", "ES"])
# hourly traffic shape: quiet nights, a morning and an evening peak
_HOURLY = np.array([2, 1, 1, 1, 1, 2, 4, 6, 8, 9, 9, 9, 10, 10, 9, 9, 9, 10, 12, 13, 12, 9, 6, 4], dtype=float)


@dataclass(frozen=True)
class GenerateConfig:
    out: str
    days: int = 3
    rows_per_day: int = 100_000
    seed: int = 7
    format: Format = "parquet"
    start: str = "2024-03-01"
    pages: int = 200
    users: int = 50_000
    files_per_day: int = 2
    bad_fraction: float = 0.0005

    def __post_init__(self) -> None:
        start_ok = False
        with suppress(ValueError):
            start_ok = dt.date.fromisoformat(self.start) is not None
        problems = [message for ok, message in (
            (self.days >= 1, f"--days must be >= 1, got {self.days}"),
            (self.rows_per_day >= 1, f"--rows-per-day must be >= 1, got {self.rows_per_day}"),
            (self.format in ("parquet", "json", "csv"), f"--format must be parquet, json or csv, got {self.format!r}"),
            (1 <= self.files_per_day <= 1000, f"--files-per-day must be 1..1000, got {self.files_per_day}"),
            (0 <= self.bad_fraction < 1, f"--bad-fraction must be in [0, 1), got {self.bad_fraction}"),
            (start_ok, f"--start must be YYYY-MM-DD, got {self.start!r}")) if not ok]
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def dates(self) -> list[str]:
        first = dt.date.fromisoformat(self.start)
        return [(first + dt.timedelta(days=i)).isoformat() for i in range(self.days)]


@dataclass(frozen=True)
class GenerateResult:
    rows: int
    bad_rows: int
    files: int
    dates: list[str]


def _zipf(rng: np.random.Generator, n_items: int, size: int, s: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, n_items + 1) ** s
    return rng.choice(n_items, size=size, p=weights / weights.sum())


def day_table(config: GenerateConfig, day_index: int) -> tuple[pa.Table, np.ndarray]:
    """One day's events and the indices of rows made bad on purpose."""
    date = dt.date.fromisoformat(config.dates[day_index])
    rng = np.random.default_rng([config.seed, day_index])
    n = config.rows_per_day
    hours = rng.choice(24, size=n, p=_HOURLY / _HOURLY.sum())
    micros = hours.astype(np.int64) * 3_600_000_000 + rng.integers(0, 3_600_000_000, size=n)
    midnight = int(dt.datetime(date.year, date.month, date.day, tzinfo=dt.UTC).timestamp() * 1_000_000)
    event_time = np.sort(midnight + micros)
    pages = _zipf(rng, config.pages, n, 1.1)
    users = _zipf(rng, config.users, n, 0.9)
    duration = np.round(rng.lognormal(7.0, 1.0, size=n) * (1 + pages % 7 / 10)).astype(np.int64)
    weight = np.round(rng.uniform(0.5, 2.0, size=n), 3)
    country = COUNTRIES[_zipf(rng, len(COUNTRIES), n, 1.2)]
    bad = np.flatnonzero(rng.random(n) < config.bad_fraction)
    et_mask, page_mask = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    et_mask[bad[::2]] = page_mask[bad[1::2]] = True  # half lack an event time, half a page (a group key)
    table = pa.table({
        "event_time": pa.array(event_time, pa.timestamp("us", tz="UTC"), mask=et_mask),
        "user_id": pa.array(np.char.add("u", np.char.zfill(users.astype(str), 6)), pa.string(),
                            mask=rng.random(n) < 0.005),
        "page": pa.array(np.char.add("/page/", pages.astype(str)), pa.string(), mask=page_mask),
        "duration_ms": pa.array(duration, pa.int64(), mask=rng.random(n) < 0.01),
        "weight": pa.array(weight, pa.float64()),
        "country": pa.array(country, pa.string(), mask=rng.random(n) < 0.02),
    })
    return table, bad


def _write_text(table: pa.Table, path: Path, fmt: Format, rng: np.random.Generator, n_bad: int) -> int:
    frame = table.to_pandas()
    if fmt == "csv":
        frame["event_time"] = frame["event_time"].dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        frame.to_csv(path, index=False)
        return 0
    lines = frame.to_json(orient="records", lines=True, date_format="iso", date_unit="us").splitlines()
    broken = rng.choice(len(lines), size=min(n_bad, len(lines)), replace=False)
    for n, i in enumerate(broken):  # every other one truncated, the others with a value of the wrong type
        lines[i] = json.dumps(json.loads(lines[i]) | {"duration_ms": "n/a"}) if n % 2 else lines[i][:len(lines[i]) // 2]
    path.write_text("\n".join(lines) + "\n")
    return len(broken)


def generate(config: GenerateConfig, *, progress: bool = True) -> GenerateResult:
    """Write ``config.days`` partitions under ``config.out``, replacing any that exist."""
    from tqdm import tqdm

    bad_rows = 0
    for i, date in enumerate(tqdm(config.dates, desc="generate", unit="day", disable=not progress)):
        table, bad = day_table(config, i)
        part = Path(config.out) / f"event_date={date}"
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        bounds = np.linspace(0, table.num_rows, config.files_per_day + 1).astype(int)
        rng = np.random.default_rng([config.seed, i, 1])
        for j in range(config.files_per_day):
            chunk = table.slice(bounds[j], bounds[j + 1] - bounds[j])
            path = part / f"part-{j:05d}.{config.format}"
            if config.format == "parquet":
                pq.write_table(chunk, path)
            else:
                bad_rows += _write_text(chunk, path, config.format, rng, max(1, len(bad) // config.files_per_day))
        bad_rows += len(bad)
    return GenerateResult(config.days * config.rows_per_day, bad_rows, config.days * config.files_per_day, config.dates)
