"""Run a quality gate: a Great Expectations suite over Spark, a readable report, a verdict.

Each gate is one :class:`Suite` of :data:`SUITES`; the batch DAG runs ``input --date D`` before combine,
``outputs --date D`` before reduce and ``outputs`` after it (docs/airflow.md, "Quality gates"). A failed gate raises
:class:`QualityError` and keeps what it rejected out of ``aggregates``: the day's rows go to ``dead_letter``, or the
day's partials are rolled back. Every run writes ``<lake>/<pipeline>/_quality/<suite>/<date|all>/<stamp>.json`` and
``.txt`` (and ``latest.*`` beside them) and records a ``validate`` row in ``runs``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from spark_jobs.errors import InputError, LakeError, QualityError, SchemaMismatchError
from spark_jobs.jobs import reduce
from spark_jobs.jobs.combine import parse_date, write_dead_letters
from spark_jobs.jobs.conflicts import retry_conflicts
from spark_jobs.jobs.landing import classify, read_landing, screen_partition
from spark_jobs.jobs.run_record import RunRecord, recorded_run
from spark_jobs.lake import PipelineTables, open_lake
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
    rollup_app_id,
)
from spark_jobs.persisted import persisted
from spark_jobs.phases.compiled import CompiledAggregates
from spark_jobs.quality.suites import coverage_columns, input_expectations, output_expectations
from spark_jobs.quality.thresholds import QualityRules, load_rules
from spark_jobs.spark_functions import F
from spark_jobs.spec import PipelineSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_jobs.lake import DataFile, Lake

__all__ = ["SUITES", "Check", "GateRun", "InputSuite", "OutputsSuite", "QualityReport", "Suite", "Validated",
           "validate"]


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
        return {k: v for k, v in asdict(self).items() if k != "report_path"}


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
    suite = context.suites.add(gx.ExpectationSuite(name=name, expectations=expectations))
    batch = batch_def.get_batch(batch_parameters={"dataframe": df})
    result = batch.validate(suite, result_format={"result_format": "SUMMARY", "partial_unexpected_count": 5})
    order = {getattr(e, "description", None): i for i, e in enumerate(expectations)}
    checks = []
    for r in result.to_json_dict()["results"]:  # type: ignore[index, union-attr]
        config, res = r["expectation_config"], r.get("result") or {}
        error = (r.get("exception_info") or {}).get("exception_message")
        kwargs = {k: v for k, v in config["kwargs"].items() if k != "batch_id"}
        checks.append(Check(config["type"], config.get("description") or config["type"], bool(r["success"]),
                            error or res.get("observed_value"), res.get("unexpected_count"),
                            res.get("unexpected_percent"), list(res.get("partial_unexpected_list") or [])[:5], kwargs))
    return sorted(checks, key=lambda c: order.get(c.description, len(order)))


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
    """One quality gate: the arguments it needs, how it loads and checks its frame, what its verdict does."""

    name: ClassVar[str]
    needs_date: ClassVar[bool] = False  # without --date it is refused before the lake is touched

    @abstractmethod
    def check(self, run: GateRun) -> Validated:
        """Load the suite's frame and run its expectations over it."""

    @abstractmethod
    def settle(self, run: GateRun, report: QualityReport, validated: Validated) -> None:
        """Act on the verdict in the lake, and say so in ``report`` and ``run.record``."""


class InputSuite(Suite):
    """The landing partition of ``--date``, typed as combine types it. On failure the rows that break a row-level
    check go to ``dead_letter`` (job ``validate``, batch ``D``) with the failed checks as reason: combine never sees
    the day, so neither ``partials`` nor ``aggregates`` change."""

    name = "input"
    needs_date = True

    def check(self, run: GateRun) -> Validated:
        spec, rules, date = run.spec, run.rules, run.date
        assert date is not None, "validate() refuses the input suite without a date"
        try:
            raw = read_landing(run.spark, spec, screen_partition(spec, date))
        except SchemaMismatchError as exc:  # the files lack or mistype a declared column: every row is rejected
            return _schema_rejects(run.spark, spec, date, exc)
        rows = classify(raw, spec, date).withColumn("_event_day", F.date_format(F.col(spec.source.event_time),
                                                                                 "yyyy-MM-dd"))
        checks, rows = _cached_checks(rows, lambda df: _run_suite(df, f"{spec.name}_input",
                                                                  input_expectations(spec, rules, date)))
        # rows that break a row-level check, with every check they break as the reason: combine's, then each range's
        reasons = [F.col("_reason")]
        for col, rng in rules.input_ranges.items():
            c = F.col(col)
            low = c < F.lit(rng.min) if rng.min is not None else F.lit(False)
            high = c > F.lit(rng.max) if rng.max is not None else F.lit(False)
            reason = F.concat(F.lit(f"quality gate: {col} "), c.cast("string"), F.lit(f" outside {rng.describe()}"))
            reasons.append(F.when(c.isNotNull() & (low | high), reason))
        bad = rows.withColumn("_reason", F.concat_ws("; ", F.array_compact(F.array(*reasons))))
        bad = bad.withColumn("_reason", F.when(F.col("_reason") != "", F.col("_reason")))
        return Validated(checks, rows, spec.source.partition_path(date), rows=rows.count(), rejects=bad)

    def settle(self, run: GateRun, report: QualityReport, validated: Validated) -> None:
        """Dead-letter the rows a failed gate rejects; a passing day clears the gate's earlier rejects of it."""
        date, record, bad = run.date, run.record, validated.rejects
        assert date is not None and bad is not None
        rejected = 0 if report.success else bad.where(bad["_reason"].isNotNull()).count()
        rejects = bad.limit(0) if report.success else bad
        commit = retry_conflicts(lambda _: write_dead_letters(
            run.lake, run.tables, rejects, job="validate", batch=date, run_id=record.run_id, rejected=rejected),
            what=f"input gate of {date}")
        report.dead_lettered = rejected
        record.rows_in, record.rows_rejected = validated.rows or 0, rejected
        record.rows_aggregated = record.rows_in - rejected
        if commit is not None:
            record.versions_written = {"dead_letter": commit.version}


class OutputsSuite(Suite):
    """With ``--date`` the day's batch partials finalised as reduce would, before reduce: ``sum(n_rows)`` must equal
    the rows its latest successful combine aggregated; a failed day's partials are rolled back to the ones
    ``aggregates`` was built from (none if it never was). Else the serving table: ``sum(n_rows)`` must equal the
    partials it consumed and, for tumbling or no windows, the combine runs in ``runs``."""

    name = "outputs"

    def check(self, run: GateRun) -> Validated:
        spec, compiled = run.spec, run.compiled
        if run.lake.version(run.tables.partials) is None:
            raise LakeError(f"no partials table at {run.tables.partials}; run combine for at least one day first")
        df, target, reconcile = _day_partials(run, run.date) if run.date is not None else _serving_table(run)
        expectations = output_expectations(spec, run.rules, reconcile=reconcile, coverage=compiled.coverage)

        def checks(frame: DataFrame) -> list[Check]:
            found = _run_suite(frame, f"{spec.name}_outputs", expectations)
            return found if run.date is not None else found + _rollup_checks(run)

        found, frame = _cached_checks(df.select("*", *coverage_columns(compiled, df.columns)), checks)
        return Validated(found, frame, target)

    def settle(self, run: GateRun, report: QualityReport, validated: Validated) -> None:
        """Roll a failed day's partials back, so no later reduce publishes them (time travel still reads them)."""
        if run.date is None or report.success:
            return
        before = run.lake.version(run.tables.partials)
        day, record = run.date, run.record
        restored, version = retry_conflicts(lambda _: _rollback_day(run, day), what=f"rollback of {day}")
        record.inputs.append(ROLLBACK)
        record.rows_aggregated, record.versions_written = restored, {"partials": version}
        report.rolled_back = (f"{day}'s partials rolled back to what aggregates holds ({restored:,} rows) "
                              f"in partials version {version}; the rejected ones are version {before}")


SUITES: dict[str, Suite] = {suite.name: suite for suite in (InputSuite(), OutputsSuite())}


def _cached_checks(df: DataFrame, checks: Callable[[DataFrame], list[Check]]) -> tuple[list[Check], DataFrame]:
    """``checks`` over ``df`` cached once: GX computes each metric as its own Spark job."""
    df = persisted(df)
    try:
        return checks(df), df
    except BaseException:  # not a catch: whatever stopped the checks, release the cache and re-raise it
        df.unpersist()
        raise


def _schema_rejects(spark: SparkSession, spec: PipelineSpec, date: str, exc: SchemaMismatchError) -> Validated:
    """The schema checks (without GX: nothing else can run) of a partition whose files mismatch, every row rejected."""
    files = spark.read.format(spec.source.format).load(spec.source.partition_path(date))
    have = files.columns
    checks = [Check("expect_column_to_exist", f"schema: source.schema declares {c} ({t})", c in have,
                    None if c in have else f"missing; files have {sorted(have)}", None, None, [], {"column": c})
              for c, t in spec.source.schema]
    if all(c.success for c in checks):
        checks.append(Check("expect_column_values_to_be_of_type", "schema: column types", False, str(exc),
                            None, None, [], {}))
    rows = files.select(F.to_json(F.struct(*files.columns)).alias("_raw"), F.col("_metadata.file_path").alias("_file"),
                        F.lit(f"quality gate: {exc}"[:1000]).alias("_reason"))
    return Validated(checks, rows, spec.source.partition_path(date), rows=rows.count(), rejects=rows)


def combined_rows(spec: PipelineSpec, days: list[str] | None = None) -> dict[str, int]:
    """Rows in each day's batch partials per ``runs``: its latest successful combine, or a later gate rollback."""
    latest = latest_combines(PipelineTables(spec.lake, spec.name).runs, days, rollbacks=True)
    return {day: int(r["rows_aggregated"] or 0) for day, r in latest.items()}


def _in_day(f: DataFile, date: str) -> bool:
    return is_batch(f) and f.partition_values.get(DAY) == date


def _n_rows(df: DataFrame) -> int:
    return int(total[0] or 0) if (total := df.agg(F.sum("n_rows")).first()) else 0


def _day_partials(run: GateRun, date: str) -> tuple[DataFrame, str, dict[str, int]]:
    """Pre-reduce: the day's batch partials finalised as reduce would, and what their rows must reconcile with."""
    tables = run.tables
    if not (files := [f.path for f in run.lake.files(tables.partials) if _in_day(f, date)]):
        raise InputError(f"no batch partials for {date} in {tables.partials}; run combine --date {date} first")
    df = reduce.reduce(run.lake.read_files(tables.partials, files), run.compiled, run_id="validate")
    runs = combined_rows(run.spec, [date])
    once = run.spec.window.rows_once and date in runs  # each row in exactly one window (tumbling or none)
    reconcile = {f"rows aggregated by the {date} combine run": runs[date]} if once else {}
    return df, f"{tables.partials} (event_date={date}, finalised)", reconcile


def _serving_table(run: GateRun) -> tuple[DataFrame, str, dict[str, int]]:
    """Post-reduce: the serving table, and the partials (and combine runs) it consumed to reconcile with."""
    spec, tables, lake = run.spec, run.tables, run.lake
    if lake.version(tables.aggregates) is None:
        raise LakeError(f"no aggregates table at {tables.aggregates}; run reduce first")
    reconcile: dict[str, int] = {}
    consumed = lake.txn_version(tables.aggregates, reduce_app_id(spec))
    if counted := counted_files(lake.files(tables.partials, consumed)):
        merged = lake.read_files(tables.partials, list(counted), version=consumed)
        reconcile[f"n_rows of the partials merged (version {consumed})"] = _n_rows(merged)
    days = sorted(batch_days(counted.values()))
    if spec.window.rows_once and days and all(is_batch(f) for f in counted.values()):  # none streamed: runs count all
        runs = combined_rows(spec, days)
        if set(runs) == set(days):
            reconcile[f"rows aggregated by the latest combine runs of {len(runs)} days"] = sum(runs.values())
    return lake.read(tables.aggregates), f"{tables.aggregates} (version {lake.version(tables.aggregates)})", reconcile


def _rollup_checks(run: GateRun) -> list[Check]:
    """Each declared rollup table: keys present, no empty or negative counts, and ``sum(n_rows)`` equal
    to that of the ``aggregates`` version it reflects (it merges every window exactly once)."""
    spec, compiled, lake, tables = run.spec, run.compiled, run.lake, run.tables
    checks: list[Check] = []
    for rollup in spec.rollups:
        path = tables.rollup(rollup.name)
        if lake.version(path) is None:
            continue  # not refreshed yet: reduce writes it
        source = lake.txn_version(path, rollup_app_id(spec, rollup))
        reconcile = {f"n_rows of aggregates version {source}": _n_rows(lake.read(tables.aggregates, version=source))}
        expectations = output_expectations(spec, None, reconcile=reconcile,
                                           keys=[*rollup.by, "window_start", "window_end"], coverage=compiled.coverage)
        for e in expectations:
            e.description = f"{rollup.table}: {e.description}"
        rows = lake.read(path)
        checks += _run_suite(rows.select("*", *coverage_columns(compiled, rows.columns)), f"{spec.name}_{rollup.table}",
                             expectations)
    return checks


def _rollback_day(run: GateRun, date: str) -> tuple[int, int | None]:
    """Put back the day's batch partials that ``aggregates`` was built from; (rows restored, commit version)."""
    lake, tables = run.lake, run.tables
    consumed = lake.txn_version(tables.aggregates, reduce_app_id(run.spec))  # None without an aggregates table
    old = [f.path for f in lake.files(tables.partials, consumed) if _in_day(f, date)] if consumed is not None else []
    if old and lake.missing_files(tables.partials, old):
        raise LakeError(f"cannot roll {date} back in {tables.partials}: the files of version {consumed} are "
                        "vacuumed; recombine the day from fixed input")
    rows = lake.read_files(tables.partials, old, version=consumed)
    restored = _n_rows(rows) if old else 0
    commit = lake.replace_partition(rows, tables.partials, partition_by=PARTIALS_PARTITIONS,
                                    partition={DAY: date, "source": BATCH},
                                    metadata={"run_id": run.record.run_id, "job": "validate", "batch": date,
                                              "rolled_back_to": consumed}, conform=True)
    return restored, commit.version


def write_report(report: QualityReport, spec: PipelineSpec, reports: str | None = None) -> None:
    root = (Path(reports) if reports else Path("quality_reports") / spec.name if "://" in spec.lake
            else Path(spec.lake) / spec.name / "_quality")
    folder = root / report.suite / (report.date or "all")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S%f}.json"
    report.report_path = str(path)
    body, text = json.dumps(report.to_json(), indent=2, default=str), report.text() + "\n"
    for name, content in ((path, body), (folder / "latest.json", body), (path.with_suffix(".txt"), text),
                          (folder / "latest.txt", text)):
        name.write_text(content)


def validate(spark: SparkSession, spec: PipelineSpec, suite: str, *, date: str | None = None,
             reports: str | None = None, run_id: str | None = None) -> QualityReport:
    """Run ``suite`` and write its report; raise :class:`QualityError` when it fails."""
    if (gate := SUITES.get(suite)) is None:
        raise InputError(f"unknown suite {suite!r}; use one of {', '.join(SUITES)}")
    if gate.needs_date and date is None:
        raise InputError(f"the {gate.name} suite validates one landing partition: pass --date YYYY-MM-DD")
    date = parse_date(date) if date is not None else None
    lake = open_lake(spark)
    compiled = CompiledAggregates(spec, ensure_applied(lake, spec, run_id=run_id or ""))
    tables = PipelineTables(spec.lake, spec.name)
    rules = load_rules(spec.origin if os.path.isfile(spec.origin) else None, spec.name)
    with recorded_run(lake, tables, job="validate", batch=date, run_id=run_id) as record:
        record.inputs = [f"suite:{gate.name}"]
        run = GateRun(spark, compiled, rules, lake, tables, date, record)
        validated = gate.check(run)
        try:
            checks = validated.checks
            report = QualityReport(spec.name, gate.name, date, validated.target, all(c.success for c in checks), checks,
                                   rows=validated.rows, run_id=record.run_id)
            gate.settle(run, report, validated)
        finally:  # a cached plan would answer a later gate over the same files in this session
            validated.frame.unpersist()
        write_report(report, spec, reports)
        record.message = f"{gate.name}: {len(report.checks) - len(report.failed)}/{len(report.checks)} met"
        if not report.success:
            failed = "; ".join(c.description for c in report.failed)
            raise QualityError(f"{spec.name} {gate.name} suite failed for {date or 'the serving table'}: {failed}. "
                               f"Full report: {report.report_path}\n{report.text()}")
    return report
