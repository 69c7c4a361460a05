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

Every run writes ``<lake>/<pipeline>/_quality/<suite>/<date|all>/<stamp>.json`` and ``.txt``
(and ``latest.*`` beside them) and records a ``validate`` row in ``runs``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from spark_jobs.errors import InputError, LakeError, QualityError, SchemaMismatchError
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
    from pyspark.sql import DataFrame, SparkSession

    from spark_jobs.lake import DataFile, Lake

__all__ = ["Check", "QualityReport", "Suite", "validate"]

Suite = Literal["input", "outputs"]
SUITES: tuple[str, ...] = ("input", "outputs")
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


# ----------------------------------------------------------------------------- the gates
def _input(spark: SparkSession, spec: PipelineSpec, rules: QualityRules, date: str
           ) -> tuple[list[Check], DataFrame, DataFrame | None]:
    """(checks, classified rows, rows to dead-letter or None when nothing may be dead-lettered)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from spark_jobs.jobs.landing import classify, read_partition
    from spark_jobs.quality.suites import input_expectations

    try:
        raw = read_partition(spark, spec, date)
    except SchemaMismatchError as exc:  # the files lack or mistype a declared column: every row is rejected
        path = spec.source.partition_path(date)
        files = spark.read.format(spec.source.format).load(path)
        checks = _schema_checks(spec, files.columns)
        if all(c.success for c in checks):
            checks.append(Check("expect_column_values_to_be_of_type", "schema: column types", False, str(exc),
                                None, None, [], {}))
        rows = files.select(F.to_json(F.struct(*files.columns)).alias("_raw"),
                            F.col("_metadata.file_path").alias("_file"),
                            F.lit(f"quality gate: {exc}"[:1000]).alias("_reason"))
        return checks, rows, rows
    rows = classify(raw, spec, date)
    et = F.col(spec.source.event_time)
    # GX computes each metric as its own Spark job: read and type the partition once
    rows = rows.withColumn("_event_day", F.date_format(et, "yyyy-MM-dd")).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        checks = _run_suite(rows, f"{spec.name}_input", input_expectations(spec, rules, date))
    except BaseException:
        rows.unpersist()
        raise
    # rows that break a row-level check, with every check they break as the reason
    reasons = [F.col("_reason")]
    for col, rng in rules.input_ranges.items():
        c = F.col(col)
        low = c < F.lit(rng.min) if rng.min is not None else F.lit(False)
        high = c > F.lit(rng.max) if rng.max is not None else F.lit(False)
        reasons.append(F.when(c.isNotNull() & (low | high),
                              F.concat(F.lit(f"quality gate: {col} "), c.cast("string"),
                                       F.lit(f" outside {rng.describe()}"))))
    bad = rows.withColumn("_reason", F.concat_ws("; ", F.array_compact(F.array(*reasons))))
    bad = bad.withColumn("_reason", F.when(F.col("_reason") != "", F.col("_reason")))
    return checks, rows, bad


def combined_rows(spec: PipelineSpec, days: list[str] | None = None) -> dict[str, int]:
    """Rows in each day's batch partials per ``runs``: its latest successful combine, or a later gate rollback."""
    from spark_jobs.lake import PipelineTables

    latest = latest_combines(PipelineTables(spec.lake, spec.name).runs, days, rollbacks=True)
    return {day: int(r["rows_aggregated"] or 0) for day, r in latest.items()}


def _outputs(spark: SparkSession, compiled: CompiledAggregates, rules: QualityRules, date: str | None, lake: Lake
             ) -> tuple[list[Check], DataFrame, str]:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from spark_jobs.jobs import reduce
    from spark_jobs.lake import PipelineTables
    from spark_jobs.quality.suites import coverage_columns, output_expectations

    spec = compiled.spec
    tables = PipelineTables(spec.lake, spec.name)
    windows_once = spec.window is None or spec.window.slide is None  # each row in exactly one window
    if lake.version(tables.partials) is None:
        raise LakeError(f"no partials table at {tables.partials}; run combine for at least one day first")
    reconcile: dict[str, int] = {}
    if date is not None:  # pre-reduce: the day's partials, finalised as reduce would
        files = [f.path for f in lake.files(tables.partials) if is_batch(f) and f.partition_values.get(DAY) == date]
        if not files:
            raise InputError(f"no batch partials for {date} in {tables.partials}; run combine --date {date} first")
        partials = lake.read_files(tables.partials, files)
        df = reduce.reduce(partials, compiled, run_id="validate")
        runs = combined_rows(spec, [date])
        if windows_once and date in runs:
            reconcile[f"rows aggregated by the {date} combine run"] = runs[date]
        target = f"{tables.partials} (event_date={date}, finalised)"
    else:  # post-reduce: the serving table against the partials it consumed
        if lake.version(tables.aggregates) is None:
            raise LakeError(f"no aggregates table at {tables.aggregates}; run reduce first")
        consumed = lake.txn_version(tables.aggregates, reduce_app_id(spec))
        counted = counted_files(lake.files(tables.partials, consumed))
        if counted:
            total = lake.read_files(tables.partials, list(counted), version=consumed).agg(F.sum("n_rows")).first()
            reconcile[f"n_rows of the partials merged (version {consumed})"] = int(total[0] or 0) if total else 0
        days = sorted(batch_days(counted.values()))
        streamed = not all(is_batch(f) for f in counted.values())
        if windows_once and not streamed and days:
            runs = combined_rows(spec, days)
            if set(runs) == set(days):
                reconcile[f"rows aggregated by the latest combine runs of {len(runs)} days"] = sum(runs.values())
        df = lake.read(tables.aggregates)
        target = f"{tables.aggregates} (version {lake.version(tables.aggregates)})"
    df = df.select("*", *coverage_columns(compiled, df.columns))
    df = df.persist(StorageLevel.MEMORY_AND_DISK)  # one computation for all of GX's metric jobs
    try:
        checks = _run_suite(df, f"{spec.name}_outputs", output_expectations(spec, rules, reconcile=reconcile,
                                                                            coverage=compiled.coverage))
        if date is None:
            checks += _rollup_checks(compiled, lake)
    except BaseException:
        df.unpersist()
        raise
    return checks, df, target


def _rollup_checks(compiled: CompiledAggregates, lake: Lake) -> list[Check]:
    """Each declared rollup table: keys present, no empty or negative counts, and ``sum(n_rows)`` equal
    to that of the ``aggregates`` version it reflects (it merges every window exactly once)."""
    from pyspark.sql import functions as F

    from spark_jobs.lake import PipelineTables
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

    from spark_jobs.lake import PipelineTables

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
    from spark_jobs.jobs.combine import parse_date, write_dead_letters
    from spark_jobs.jobs.conflicts import retry_conflicts
    from spark_jobs.jobs.run_record import recorded_run
    from spark_jobs.lake import PipelineTables, open_lake

    if suite not in SUITES:
        raise InputError(f"unknown suite {suite!r}; use one of {', '.join(SUITES)}")
    if suite == "input" and date is None:
        raise InputError("the input suite validates one landing partition: pass --date YYYY-MM-DD")
    date = parse_date(date) if date is not None else None
    lake = lake or open_lake(spark)
    compiled = CompiledAggregates(spec, ensure_applied(lake, spec, run_id=run_id or ""))
    tables = PipelineTables(spec.lake, spec.name)
    rules = load_rules(spec.origin if os.path.isfile(spec.origin) else None, spec.name)
    with recorded_run(lake, tables, job="validate", batch=date, run_id=run_id) as record:
        record.inputs = [f"suite:{suite}"]
        if suite == "input":
            assert date is not None
            checks, rows, bad = _input(spark, spec, rules, date)
            target = spec.source.partition_path(date)
        else:
            checks, rows, target = _outputs(spark, compiled, rules, date, lake)
            bad = None
        report = QualityReport(spec.name, suite, date, target, all(c.success for c in checks), checks,
                               run_id=record.run_id)
        counted = rows.count() if suite == "input" else None
        report.rows = counted
        if suite == "input" and bad is not None:
            assert date is not None
            if report.success:  # a passing day clears the gate's earlier rejects of that day
                bad, rejected = bad.limit(0), 0
            else:
                rejected = bad.where(bad["_reason"].isNotNull()).count()
            rejects = bad
            commit = retry_conflicts(lambda _: write_dead_letters(
                lake, tables, rejects, job="validate", batch=date, run_id=record.run_id, rejected=rejected),
                what=f"input gate of {date}")
            report.dead_lettered = rejected
            record.rows_in, record.rows_rejected = counted or 0, rejected
            record.rows_aggregated = record.rows_in - rejected
            if commit is not None:
                record.versions_written = {"dead_letter": commit.version}
        if suite == "outputs" and date is not None and not report.success:
            before = lake.version(tables.partials)
            day = date
            restored, version = retry_conflicts(lambda _: _rollback_day(spec, lake, day, record.run_id),
                                                what=f"rollback of {date}")
            record.inputs.append(ROLLBACK)
            record.rows_aggregated = restored
            record.versions_written = {"partials": version}
            report.rolled_back = (f"{date}'s partials rolled back to what aggregates holds ({restored:,} rows) "
                                  f"in partials version {version}; the rejected ones are version {before}")
        rows.unpersist()  # a cached plan would answer a later gate over the same files in this session
        write_report(report, spec, reports)
        record.message = f"{suite}: {len(report.checks) - len(report.failed)}/{len(report.checks)} met"
        if not report.success:
            failed = "; ".join(c.description for c in report.failed)
            raise QualityError(f"{spec.name} {suite} suite failed for {date or 'the serving table'}: {failed}. "
                               f"Full report: {report.report_path}\n{report.text()}")
    return report
