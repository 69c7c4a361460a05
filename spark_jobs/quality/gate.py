"""Run a quality gate: a Great Expectations suite over Spark, a readable report, a verdict.

Three gates, in the order the batch DAG runs them (see docs/airflow.md, "Quality gates"):

- ``input --date D``: the landing partition, typed as combine types it. On failure, the rows
  that break a row-level check go to ``dead_letter`` (job ``validate``, batch ``D``) with the
  failed checks as reason, and :class:`QualityError` is raised: combine never sees the day, so
  neither ``partials`` nor ``aggregates`` change.
- ``outputs --date D``: the day's batch partials, finalised as reduce would finalise them
  (the would-be contribution of the day), before reduce touches ``aggregates``; their
  ``sum(n_rows)`` must equal the rows the day's latest successful combine run aggregated.
  On failure the day's partials are rolled back to the ones ``aggregates`` was built from
  (none, if the day was never reduced), so no later reduce publishes the rejected day; the
  rejected partials stay readable by time travel (the report names the version).
- ``outputs``: the serving table after reduce; ``sum(n_rows)`` must equal the partials it
  consumed and, for tumbling or no windows, the combine runs in ``runs``.

Each gate is one :class:`Suite` (see :data:`SUITES`): it knows the frame it loads, its expectations
and what its verdict does to the lake; :func:`validate` runs any of them the same way.

Every run writes ``<lake>/<pipeline>/_quality/<suite>/<date|all>/<stamp>.json`` and ``.txt``
(and ``latest.*`` beside them) and records a ``validate`` row in ``runs``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from spark_jobs.errors import InputError, LakeError, QualityError, SchemaMismatchError
from spark_jobs.lake import PipelineTables
from spark_jobs.lake.runs_table import ROLLBACK, latest_combines
from spark_jobs.lake.spec_record import ensure_applied
from spark_jobs.lake.table_rules import (
    BATCH,
    DAY,
    PARTIALS_PARTITIONS,
    batch_days,
    counted_files,
    is_batch,
    reduce_app_id,
)
from spark_jobs.phases.compiled import CompiledAggregates
from spark_jobs.quality.thresholds import QualityRules, load_rules
from spark_jobs.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from spark_jobs.jobs.run_record import RunRecord
    from spark_jobs.lake import DataFile, Lake

__all__ = ["SUITES", "Check", "GateRun", "InputSuite", "OutputsSuite", "QualityReport", "Suite", "Validated",
           "validate"]

log = logging.getLogger("spark_jobs")


@dataclass(frozen=True)
class Check:
    """One expectation's outcome, as the report shows it."""

    expectation: str
    description: str
    success: bool
    observed: Any
    unexpected_count: int | None
    unexpected_percent: float | None
    unexpected_examples: list[Any]
    kwargs: dict[str, Any]

    def line(self) -> str:
        mark = "ok  " if self.success else "FAIL"
        seen = f"observed {self.observed!r}" if self.observed is not None else ""
        if self.unexpected_count:
            seen = f"{self.unexpected_count:,} unexpected ({self.unexpected_percent or 0:.2f}%), e.g. " \
                   f"{self.unexpected_examples[:3]!r}"
        return f"  {mark} {self.description or self.expectation}: {seen}".rstrip(": ")


@dataclass
class QualityReport:
    pipeline: str
    suite: str
    date: str | None
    target: str
    success: bool
    checks: list[Check]
    rows: int | None = None
    dead_lettered: int = 0
    rolled_back: str | None = None
    report_path: str | None = None
    run_id: str | None = None
    validated_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.success]

    def text(self) -> str:
        head = (f"{self.pipeline} {self.suite} suite{' for ' + self.date if self.date else ''}: "
                f"{'PASSED' if self.success else 'FAILED'} "
                f"({len(self.checks) - len(self.failed)}/{len(self.checks)} expectations met) on {self.target}")
        lines = [head, *(c.line() for c in self.checks)]
        if self.dead_lettered:
            lines.append(f"  {self.dead_lettered:,} rows breaking row-level checks written to dead_letter "
                         f"(job validate, batch {self.date})")
        if self.rolled_back:
            lines.append(f"  {self.rolled_back}")
        if self.report_path:
            lines.append(f"  report: {self.report_path}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "suite": self.suite, "date": self.date, "target": self.target,
                "success": self.success, "rows": self.rows, "dead_lettered": self.dead_lettered,
                "rolled_back": self.rolled_back,
                "validated_at": self.validated_at, "run_id": self.run_id,
                "checks": [c.__dict__ for c in self.checks]}


# ----------------------------------------------------------------------------- GX
def _run_suite(df: DataFrame, name: str, expectations: list[Any]) -> list[Check]:
    """Validate ``df`` with an ephemeral GX context and a Spark datasource."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    for logger in ("great_expectations", "great_expectations.data_context.types.base"):  # the latter sets INFO itself
        logging.getLogger(logger).setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    batch_def = (context.data_sources.add_spark("spark_jobs").add_dataframe_asset(name)
                 .add_batch_definition_whole_dataframe(name))
    suite = context.suites.add(gx.ExpectationSuite(name=name))
    for expectation in expectations:
        suite.add_expectation(expectation)
    batch = batch_def.get_batch(batch_parameters={"dataframe": df})
    result = batch.validate(suite, result_format={"result_format": "SUMMARY", "partial_unexpected_count": 5})
    order = {getattr(e, "description", None): i for i, e in enumerate(expectations)}
    checks = []
    for r in result.to_json_dict()["results"]:  # type: ignore[index, union-attr]
        config, res = r["expectation_config"], r.get("result") or {}
        error = (r.get("exception_info") or {}).get("exception_message")
        kwargs = {k: v for k, v in config["kwargs"].items() if k != "batch_id"}
        checks.append(Check(
            expectation=config["type"], description=config.get("description") or config["type"],
            success=bool(r["success"]), observed=error or res.get("observed_value"),
            unexpected_count=res.get("unexpected_count"), unexpected_percent=res.get("unexpected_percent"),
            unexpected_examples=list(res.get("partial_unexpected_list") or [])[:5], kwargs=kwargs,
        ))
    return sorted(checks, key=lambda c: order.get(c.description, len(order)))


def _schema_checks(spec: PipelineSpec, columns: list[str]) -> list[Check]:
    """The schema checks without GX: used when the files lack a declared column (nothing else can run)."""
    return [Check("expect_column_to_exist", f"schema: source.schema declares {c} ({t})", c in columns,
                  None if c in columns else f"missing; files have {sorted(columns)}", None, None, [], {"column": c})
            for c, t in spec.source.schema]


# ----------------------------------------------------------------------------- the suites
@dataclass(frozen=True)
class GateRun:
    """What a suite reads and writes in one :func:`validate` call."""

    spark: SparkSession
    compiled: CompiledAggregates
    rules: QualityRules
    lake: Lake
    tables: PipelineTables
    date: str | None
    record: RunRecord

    @property
    def spec(self) -> PipelineSpec:
        return self.compiled.spec


@dataclass
class Validated:
    """A suite's checks over the frame it validated; ``rejects``: rows with the reason a failed gate gives them."""

    checks: list[Check]
    frame: DataFrame  # cached for GX's metric jobs: released once the verdict is acted on
    target: str
    rows: int | None = None
    rejects: DataFrame | None = None


class Suite(ABC):
    """One quality gate: which arguments it needs, how it loads and checks its frame, what its verdict does.

    :func:`validate` runs any suite the same way; the suite alone knows what it validates.
    """

    name: ClassVar[str]

    def require(self, date: str | None) -> None:  # noqa: B027 (optional hook: most suites take any date)
        """Refuse arguments this suite cannot validate, before the lake is touched."""

    @abstractmethod
    def check(self, run: GateRun) -> Validated:
        """Load the suite's frame and run its expectations over it."""

    @abstractmethod
    def settle(self, run: GateRun, report: QualityReport, validated: Validated) -> None:
        """Act on the verdict in the lake, and say so in ``report`` and ``run.record``."""


class InputSuite(Suite):
    """The landing partition of ``--date``, typed as combine types it; its rejects go to ``dead_letter``."""

    name = "input"

    def require(self, date: str | None) -> None:
        if date is None:
            raise InputError("the input suite validates one landing partition: pass --date YYYY-MM-DD")

    def check(self, run: GateRun) -> Validated:
        date = self._date(run)
        checks, rows, bad = _input(run.spark, run.spec, run.rules, date)
        return Validated(checks, rows, run.spec.source.partition_path(date), rows=rows.count(), rejects=bad)

    def settle(self, run: GateRun, report: QualityReport, validated: Validated) -> None:
        """Dead-letter the rows a failed gate rejects; a passing day clears the gate's earlier rejects of it."""
        from spark_jobs.jobs.combine import write_dead_letters
        from spark_jobs.jobs.conflicts import retry_conflicts

        date, record, bad = self._date(run), run.record, validated.rejects
        if bad is None:
            return
        if report.success:
            bad, rejected = bad.limit(0), 0
        else:
            rejected = bad.where(bad["_reason"].isNotNull()).count()
        rejects = bad
        commit = retry_conflicts(lambda _: write_dead_letters(
            run.lake, run.tables, rejects, job="validate", batch=date, run_id=record.run_id, rejected=rejected),
            what=f"input gate of {date}")
        report.dead_lettered = rejected
        record.rows_in, record.rows_rejected = validated.rows or 0, rejected
        record.rows_aggregated = record.rows_in - rejected
        if commit is not None:
            record.versions_written = {"dead_letter": commit.version}

    @staticmethod
    def _date(run: GateRun) -> str:
        assert run.date is not None, "require() refuses the input suite without a date"
        return run.date


class OutputsSuite(Suite):
    """A day's batch partials finalised as reduce would (``--date``), or the serving table after reduce.

    A failed day's partials are rolled back to the ones ``aggregates`` was built from.
    """

    name = "outputs"

    def check(self, run: GateRun) -> Validated:
        from spark_jobs.quality.suites import coverage_columns, output_expectations

        spec, compiled = run.spec, run.compiled
        if run.lake.version(run.tables.partials) is None:
            raise LakeError(f"no partials table at {run.tables.partials}; run combine for at least one day first")
        df, target, reconcile = _day_partials(run, run.date) if run.date is not None else _serving_table(run)
        expectations = output_expectations(spec, run.rules, reconcile=reconcile, coverage=compiled.coverage)

        def checks(frame: DataFrame) -> list[Check]:
            found = _run_suite(frame, f"{spec.name}_outputs", expectations)
            return found if run.date is not None else found + _rollup_checks(compiled, run.lake)

        found, frame = _cached_checks(df.select("*", *coverage_columns(compiled, df.columns)), checks)
        return Validated(found, frame, target)

    def settle(self, run: GateRun, report: QualityReport, validated: Validated) -> None:
        """Roll a failed day's partials back, so no later reduce publishes them (time travel still reads them)."""
        from spark_jobs.jobs.conflicts import retry_conflicts

        if run.date is None or report.success:
            return
        before = run.lake.version(run.tables.partials)
        day, record = run.date, run.record
        restored, version = retry_conflicts(lambda _: _rollback_day(run.spec, run.lake, day, record.run_id),
                                            what=f"rollback of {day}")
        record.inputs.append(ROLLBACK)
        record.rows_aggregated = restored
        record.versions_written = {"partials": version}
        report.rolled_back = (f"{day}'s partials rolled back to what aggregates holds ({restored:,} rows) "
                              f"in partials version {version}; the rejected ones are version {before}")


SUITES: dict[str, Suite] = {suite.name: suite for suite in (InputSuite(), OutputsSuite())}


def _cached_checks(df: DataFrame, checks: Callable[[DataFrame], list[Check]]) -> tuple[list[Check], DataFrame]:
    """``checks`` over ``df`` cached once: GX computes each metric as its own Spark job."""
    from pyspark import StorageLevel

    df = df.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return checks(df), df
    except BaseException:  # not a catch: whatever stopped the checks, release the cache and re-raise it
        df.unpersist()
        raise


def _input(spark: SparkSession, spec: PipelineSpec, rules: QualityRules, date: str
           ) -> tuple[list[Check], DataFrame, DataFrame]:
    """(checks, classified rows, the rows with the reasons a failed gate dead-letters them)."""
    from pyspark.sql import functions as F

    from spark_jobs.jobs.landing import classify, read_landing, screen_partition
    from spark_jobs.quality.suites import input_expectations

    try:
        raw = read_landing(spark, spec, screen_partition(spec, date))
    except SchemaMismatchError as exc:  # the files lack or mistype a declared column: every row is rejected
        return _schema_rejects(spark, spec, date, exc)
    rows = classify(raw, spec, date).withColumn("_event_day", F.date_format(F.col(spec.source.event_time),
                                                                             "yyyy-MM-dd"))
    checks, rows = _cached_checks(rows, lambda df: _run_suite(df, f"{spec.name}_input",
                                                              input_expectations(spec, rules, date)))
    # rows that break a row-level check, with every check they break as the reason
    reasons = [F.col("_reason"), *_range_reasons(rules)]
    bad = rows.withColumn("_reason", F.concat_ws("; ", F.array_compact(F.array(*reasons))))
    bad = bad.withColumn("_reason", F.when(F.col("_reason") != "", F.col("_reason")))
    return checks, rows, bad


def _schema_rejects(spark: SparkSession, spec: PipelineSpec, date: str, exc: SchemaMismatchError
                    ) -> tuple[list[Check], DataFrame, DataFrame]:
    """The schema checks of a partition whose files do not match the spec, and all its rows as rejects."""
    from pyspark.sql import functions as F

    files = spark.read.format(spec.source.format).load(spec.source.partition_path(date))
    checks = _schema_checks(spec, files.columns)
    if all(c.success for c in checks):
        checks.append(Check("expect_column_values_to_be_of_type", "schema: column types", False, str(exc),
                            None, None, [], {}))
    rows = files.select(F.to_json(F.struct(*files.columns)).alias("_raw"),
                        F.col("_metadata.file_path").alias("_file"),
                        F.lit(f"quality gate: {exc}"[:1000]).alias("_reason"))
    return checks, rows, rows


def _range_reasons(rules: QualityRules) -> list[Column]:
    """Per ranged input column: the reason a row breaks its range (NULL when it holds)."""
    from pyspark.sql import functions as F

    reasons = []
    for col, rng in rules.input_ranges.items():
        c = F.col(col)
        low = c < F.lit(rng.min) if rng.min is not None else F.lit(False)
        high = c > F.lit(rng.max) if rng.max is not None else F.lit(False)
        reasons.append(F.when(c.isNotNull() & (low | high),
                              F.concat(F.lit(f"quality gate: {col} "), c.cast("string"),
                                       F.lit(f" outside {rng.describe()}"))))
    return reasons


def combined_rows(spec: PipelineSpec, days: list[str] | None = None) -> dict[str, int]:
    """Rows in each day's batch partials per ``runs``: its latest successful combine, or a later gate rollback."""
    latest = latest_combines(PipelineTables(spec.lake, spec.name).runs, days, rollbacks=True)
    return {day: int(r["rows_aggregated"] or 0) for day, r in latest.items()}


def _day_partials(run: GateRun, date: str) -> tuple[DataFrame, str, dict[str, int]]:
    """Pre-reduce: the day's batch partials finalised as reduce would, and what their rows must reconcile with."""
    from spark_jobs.jobs import reduce

    spec, tables = run.spec, run.tables
    files = [f.path for f in run.lake.files(tables.partials) if is_batch(f) and f.partition_values.get(DAY) == date]
    if not files:
        raise InputError(f"no batch partials for {date} in {tables.partials}; run combine --date {date} first")
    df = reduce.reduce(run.lake.read_files(tables.partials, files), run.compiled, run_id="validate")
    runs = combined_rows(spec, [date])
    reconcile = {}
    if _windows_once(spec) and date in runs:
        reconcile[f"rows aggregated by the {date} combine run"] = runs[date]
    return df, f"{tables.partials} (event_date={date}, finalised)", reconcile


def _serving_table(run: GateRun) -> tuple[DataFrame, str, dict[str, int]]:
    """Post-reduce: the serving table, and the partials (and combine runs) it consumed to reconcile with."""
    from pyspark.sql import functions as F

    spec, tables, lake = run.spec, run.tables, run.lake
    if lake.version(tables.aggregates) is None:
        raise LakeError(f"no aggregates table at {tables.aggregates}; run reduce first")
    reconcile: dict[str, int] = {}
    consumed = lake.txn_version(tables.aggregates, reduce_app_id(spec))
    counted = counted_files(lake.files(tables.partials, consumed))
    if counted:
        total = lake.read_files(tables.partials, list(counted), version=consumed).agg(F.sum("n_rows")).first()
        reconcile[f"n_rows of the partials merged (version {consumed})"] = int(total[0] or 0) if total else 0
    days = sorted(batch_days(counted.values()))
    streamed = not all(is_batch(f) for f in counted.values())
    if _windows_once(spec) and not streamed and days:
        runs = combined_rows(spec, days)
        if set(runs) == set(days):
            reconcile[f"rows aggregated by the latest combine runs of {len(runs)} days"] = sum(runs.values())
    return lake.read(tables.aggregates), f"{tables.aggregates} (version {lake.version(tables.aggregates)})", reconcile


def _windows_once(spec: PipelineSpec) -> bool:
    """Each row falls in exactly one window (tumbling or none): row counts reconcile with the combine runs."""
    return spec.window.rows_once


def _rollup_checks(compiled: CompiledAggregates, lake: Lake) -> list[Check]:
    """Each declared rollup table: keys present, no empty or negative counts, and ``sum(n_rows)`` equal
    to that of the ``aggregates`` version it reflects (it merges every window exactly once)."""
    from pyspark.sql import functions as F

    from spark_jobs.lake.table_rules import rollup_app_id
    from spark_jobs.quality.suites import coverage_columns, output_expectations

    spec = compiled.spec
    tables = PipelineTables(spec.lake, spec.name)
    checks: list[Check] = []
    for rollup in spec.rollups:
        path = tables.rollup(rollup.name)
        if lake.version(path) is None:
            continue  # not refreshed yet: reduce writes it
        source = lake.txn_version(path, rollup_app_id(spec, rollup))
        total = lake.read(tables.aggregates, version=source).agg(F.sum("n_rows")).first()
        reconcile = {f"n_rows of aggregates version {source}": int(total[0] or 0) if total else 0}
        expectations = output_expectations(spec, None, reconcile=reconcile,
                                           keys=[*rollup.by, "window_start", "window_end"], coverage=compiled.coverage)
        for e in expectations:
            e.description = f"{rollup.table}: {e.description}"
        rows = lake.read(path)
        checks += _run_suite(rows.select("*", *coverage_columns(compiled, rows.columns)), f"{spec.name}_{rollup.table}",
                             expectations)
    return checks


def _rollback_day(spec: PipelineSpec, lake: Lake, date: str, run_id: str) -> tuple[int, int | None]:
    """Put back the day's batch partials that ``aggregates`` was built from; (rows restored, commit version)."""
    from pyspark.sql import functions as F

    tables = PipelineTables(spec.lake, spec.name)

    def in_day(f: DataFile) -> bool:
        return is_batch(f) and f.partition_values.get(DAY) == date

    consumed = lake.txn_version(tables.aggregates, reduce_app_id(spec)) \
        if lake.version(tables.aggregates) is not None else None
    old = [f.path for f in lake.files(tables.partials, consumed) if in_day(f)] if consumed is not None else []
    if old and lake.missing_files(tables.partials, old):
        raise LakeError(f"cannot roll {date} back in {tables.partials}: the files of version {consumed} are "
                        "vacuumed; recombine the day from fixed input")
    rows = lake.read_files(tables.partials, old, version=consumed)
    total = rows.agg(F.sum("n_rows")).first() if old else None
    commit = lake.replace_partition(rows, tables.partials, partition_by=PARTIALS_PARTITIONS,
                                    partition={DAY: date, "source": BATCH},
                                    metadata={"run_id": run_id, "job": "validate", "batch": date,
                                              "rolled_back_to": consumed}, conform=True)
    return (int(total[0] or 0) if total else 0), commit.version


def _report_dir(spec: PipelineSpec, suite: str, date: str | None, reports: str | None) -> Path:
    root = Path(reports) if reports else Path(spec.lake) / spec.name / "_quality"
    if not reports and "://" in spec.lake:
        root = Path("quality_reports") / spec.name
    return root / suite / (date or "all")


def write_report(report: QualityReport, spec: PipelineSpec, reports: str | None = None) -> Path:
    folder = _report_dir(spec, report.suite, report.date, reports)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%f")
    path = folder / f"{stamp}.json"
    report.report_path = str(path)
    body = json.dumps(report.to_json(), indent=2, default=str)
    text = report.text() + "\n"
    for name in (path, folder / "latest.json"):
        name.write_text(body)
    for name in (path.with_suffix(".txt"), folder / "latest.txt"):
        name.write_text(text)
    return path


def validate(spark: SparkSession, spec: PipelineSpec, suite: str, *, date: str | None = None,
             lake: Lake | None = None, reports: str | None = None, run_id: str | None = None) -> QualityReport:
    """Run ``suite`` and write its report; raise :class:`QualityError` when it fails."""
    from spark_jobs.jobs.combine import parse_date
    from spark_jobs.jobs.run_record import recorded_run
    from spark_jobs.lake import open_lake

    if suite not in SUITES:
        raise InputError(f"unknown suite {suite!r}; use one of {', '.join(SUITES)}")
    gate = SUITES[suite]
    gate.require(date)
    date = parse_date(date) if date is not None else None
    lake = lake or open_lake(spark)
    compiled = CompiledAggregates(spec, ensure_applied(lake, spec, run_id=run_id or ""))
    tables = PipelineTables(spec.lake, spec.name)
    rules = load_rules(spec.origin if os.path.isfile(spec.origin) else None, spec.name)
    with recorded_run(lake, tables, job="validate", batch=date, run_id=run_id) as record:
        record.inputs = [f"suite:{gate.name}"]
        report = _judge(gate, GateRun(spark, compiled, rules, lake, tables, date, record))
        write_report(report, spec, reports)
        record.message = f"{gate.name}: {len(report.checks) - len(report.failed)}/{len(report.checks)} met"
        if not report.success:
            failed = "; ".join(c.description for c in report.failed)
            raise QualityError(f"{spec.name} {gate.name} suite failed for {date or 'the serving table'}: {failed}. "
                               f"Full report: {report.report_path}\n{report.text()}")
    return report


def _judge(suite: Suite, run: GateRun) -> QualityReport:
    """Run ``suite`` and act on its verdict; the validated frame is released either way."""
    validated = suite.check(run)
    try:
        report = QualityReport(run.spec.name, suite.name, run.date, validated.target,
                               all(c.success for c in validated.checks), validated.checks, rows=validated.rows,
                               run_id=run.record.run_id)
        suite.settle(run, report, validated)
    finally:  # a cached plan would answer a later gate over the same files in this session
        validated.frame.unpersist()
    return report
