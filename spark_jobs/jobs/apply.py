"""apply: make a live lake match a changed spec, exactly once, without raw data wherever the algebra allows.

For spec version ``V`` (:mod:`spark_jobs.spec_plan` sorts the changes; docs/evolution.md tells which is which):

1. Record ``V`` as ``applying`` in ``specs``: from here every job refuses to start (``ensure_applied``).
2. Bring each spec-shaped table to ``V``, one Delta commit per table carrying the app transaction
   ``<pipeline>.spec = V``; a table that already has it is skipped, so a rerun after ``kill -9`` continues
   where the last one stopped. In order: the stream's state, ``partials``, ``aggregates`` (their reduce),
   ``changelog`` (it keeps dropped columns: it is a log; then the change of ``aggregates`` is told) and the rollups.
   An added aggregate only adds columns (NULL until the days are recombined); a change of the rows' layout (a key
   added, a window refined, the source's typing) empties the tables instead: every day must be recombined.
3. Record ``V`` as ``applied``: jobs with the new spec run again.

A writer that raced the apply conflicts on the ``<pipeline>.spec`` app transaction and retries, and its
retry refuses (the spec changed); a commit lost by apply itself re-plans from the new snapshot. The
merges run in Arrow on the driver (no JVM) unless a table is larger than ``ARROW_MAX_ROWS``, then in Spark.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.errors import LakeError, SpecChangedError
from spark_jobs.jobs import changelog_feed, rollups
from spark_jobs.jobs.conflicts import retry_conflicts
from spark_jobs.jobs.forked import cores, forked_map
from spark_jobs.jobs.reduce import reduce
from spark_jobs.jobs.run_record import new_run_id, recorded_run
from spark_jobs.lake import AppTxn, Cluster, DataFile, Lake, PipelineTables, open_lake, storage
from spark_jobs.lake.arrow import read_data_files
from spark_jobs.lake.coverage import day_versions
from spark_jobs.lake.layout import SPEC_VERSION, TS, table_schema
from spark_jobs.lake.reader import is_table, open_table
from spark_jobs.lake.spec_record import (
    APPLIED,
    APPLYING,
    RecordedSpec,
    first_record,
    normalise,
    read_records,
    spec_app_id,
    table_spec_version,
    write_record,
)
from spark_jobs.lake.table_rules import (
    BATCH,
    DAY,
    PARTIALS_PARTITIONS,
    STREAM,
    batch_days,
    counted_files,
    reduce_app_id,
    rollup_app_id,
    sort_keys,
    stream_app_id,
    window_cluster,
)
from spark_jobs.phases.arrow_merge import Merged, Stored, encoded_columns, merge_groups, value_columns
from spark_jobs.phases.compiled import CompiledAggregates, final_aggregate
from spark_jobs.spark_functions import F
from spark_jobs.spec import PipelineSpec, RollupSpec
from spark_jobs.spec_plan import Diff, Plan, make_plan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ARROW_MAX_ROWS", "ApplyResult", "apply"]

_VALUE = "__value:"  # the value columns that ride along the merged partials
_PARTIAL_KEYS = ["batch", "source", DAY]  # a partial row merges only within its batch and day
_PARTIAL_EXTRA = [("run_id", "min"), ("created_at", "max")]
ARROW_MAX_ROWS = 2_000_000  # rows of a table merged on the driver; a larger one merges in Spark
Engine = Literal["auto", "arrow", "spark"]
_Rows = TypeVar("_Rows", pa.Table, "DataFrame")  # a step's rows: Arrow on the driver, or Spark


@dataclass
class ApplyResult:
    plan: Plan
    version: int
    written: dict[str, int | None] = field(default_factory=dict)
    engine: str = "arrow"
    seconds: float = 0.0

    def summary(self) -> str:
        if self.plan.unchanged:
            return self.plan.text()
        tables = ", ".join(f"{t} v{v}" for t, v in self.written.items()) or "no table rewritten"
        return (f"{self.plan.pipeline}: applied spec version {self.version} in {self.seconds:.1f}s "
                f"({self.engine}; {tables})")


def apply(spec: PipelineSpec, *, spark: Callable[[], SparkSession] | None = None, engine: Engine = "auto",
          run_id: str | None = None) -> ApplyResult:
    """Make the lake match ``spec`` (see the module doc). ``spark`` builds a session when a merge needs one. A
    refused change raises :class:`SpecChangedError` (exit 2), with the reason and the way out."""
    started = time.monotonic()
    run_id = run_id or new_run_id("apply")
    plan = make_plan(spec, read_records(spec.lake, spec.name))
    result = ApplyResult(plan, plan.version)
    if plan.diff.refused:
        raise SpecChangedError("apply refused: " + "; ".join(f"{c.what}: {c.effect}" for c in plan.diff.refused))
    if plan.unchanged:
        return result
    current = plan.current
    if current is None and plan.new_tables:  # a new lake: the spec is all there is to record
        write_record(spec.lake, spec.name, first_record(spec, run_id=run_id))
        result.seconds = time.monotonic() - started
        return result
    tables = PipelineTables(spec.lake, spec.name)
    # the plan counted the rows of the tables a derive rewrites (of none otherwise)
    use_spark = engine == "spark" or (engine == "auto" and max(plan.table_rows.values(), default=0) > ARROW_MAX_ROWS)
    session = spark() if use_spark and spark is not None else None
    if use_spark and session is None:
        raise LakeError("this apply merges in Spark (a large lake, or --engine spark) but no Spark session is "
                        "available")
    result.engine = "spark" if session is not None else "arrow"
    lake = open_lake(session)
    target = (_adopt(spec, tables, run_id) if current is None
              else _target(spec, current, plan.diff, tables, run_id) if current.applied else current)
    if target is not current:
        if current is not None and plan.diff.dropped_keys:  # the rows' names change: commits told by the old rule
            changelog_feed.tell_commits(lake, current.pipeline_spec(lake=spec.lake), run_id=run_id, settle=True)
        write_record(spec.lake, spec.name, target)
    lake.spec_txn = AppTxn(spec_app_id(spec.name), target.version)
    with recorded_run(lake, tables, job="apply", batch=f"spec-{target.version}", run_id=run_id) as record:
        record.inputs = [spec.origin]
        result.written = _Migration(lake, spec, target, plan.diff, tables, run_id, session).run()
        write_record(spec.lake, spec.name, dataclasses.replace(target, status=APPLIED, recorded_at=None, run_id=run_id))
        refreshed = rollups.refresh(lake, CompiledAggregates(spec, target), run_id=run_id)
        result.written.update({k: v for k, v in refreshed.items() if v is not None})
        record.versions_written = dict(result.written)
        record.message = f"spec version {target.version}: " + "; ".join(c.what for c in plan.diff.changes)[:3000]
    result.seconds = time.monotonic() - started
    return result


def _target(spec: PipelineSpec, current: RecordedSpec, diff: Diff, tables: PipelineTables, run_id: str) -> RecordedSpec:
    """The record of the new version: each aggregate's coverage, and what a layout change left uncovered."""
    version = current.version + 1
    coverage = {a.name: version if (diff.reset or a.name in diff.added) else current.since(a.name)
                for a in spec.aggregates}
    through = current.uncovered_through
    if diff.reset and (days := day_versions(tables.partials)):
        through = max(dt.date.fromisoformat(max(days)), through or dt.date.min)
    return RecordedSpec(version=version, status=APPLYING, spec=normalise(spec), coverage=coverage,
                        layout_since=version if diff.reset else current.layout_since, uncovered_through=through,
                        changes=[dataclasses.asdict(c) for c in diff.changes], run_id=run_id)


def _adopt(spec: PipelineSpec, tables: PipelineTables, run_id: str) -> RecordedSpec:
    """A lake from before spec records: its tables must have ``spec``'s columns (and windows); then they
    gain ``spec_version`` and the spec is recorded as version 1."""
    problems = []
    named: list[tuple[str, str, RollupSpec | None]] = [
        ("state", tables.stream_state, None), ("partials", tables.partials, None),
        ("aggregates", tables.aggregates, None), ("changelog", tables.changelog, None),
        *((r.table, tables.rollup(r.name), r) for r in spec.rollups)]
    for name, path, rollup in named:
        if not is_table(path):
            continue
        have = {f.name: str(f.type) for f in open_table(path).schema() if f.name != SPEC_VERSION}
        want = {f.name: str(f.type) for f in table_schema(spec, name, rollup) if f.name != SPEC_VERSION}
        missing = {c: t for c, t in want.items() if have.get(c) != t}
        extra = {} if name == "changelog" else {c: t for c, t in have.items() if c not in want}  # a log keeps more
        if missing or extra:
            problems.append(f"{name}: " + "; ".join(
                [*(f"lacks {c} ({t})" for c, t in missing.items()), *(f"has {c} ({t})" for c, t in extra.items())]))
    if spec.window.bounds and is_table(tables.aggregates):
        row = open_table(tables.aggregates).head(1, ["window_start", "window_end"]).to_pylist()
        if row and not spec.window.fits(row[0]["window_start"], row[0]["window_end"]):
            size = (row[0]["window_end"] - row[0]["window_start"]).total_seconds()
            problems.append(f"aggregates: windows of {size:.0f} s, the spec says {spec.window}")
    if problems:
        raise SpecChangedError(
            f"the lake {spec.lake}/{spec.name} records no spec, and its tables were not written with "
            f"{spec.origin}: {' | '.join(problems)}. Apply the spec they were written with first (it becomes "
            "version 1), then this one")
    return first_record(spec, run_id=run_id, status=APPLYING,
                        changes=[{"kind": "settings", "field": "spec", "what": "adopted", "effect": ""}])


class _Migration:
    """Each spec-shaped table brought to the target version, skipping those already there."""

    def __init__(self, lake: Lake, spec: PipelineSpec, target: RecordedSpec, diff: Diff, tables: PipelineTables,
                 run_id: str, spark: SparkSession | None) -> None:
        self.lake, self.spec, self.diff, self.tables, self.run_id, self.spark = lake, spec, diff, tables, run_id, spark
        self.version = target.version
        self.txn = AppTxn(spec_app_id(spec.name), target.version)  # every commit of this apply carries it
        self.written: dict[str, int | None] = {}
        # the partials this run merged and wrote (version, rows with values): the reduce starts from them
        self.merged_partials: tuple[int | None, pa.Table] | None = None
        # aggregates had merged every partial when this run started: its rows can stand when only columns go
        partials = lake.version(tables.partials)
        self.reduced = partials is not None and is_table(tables.aggregates) and (
            lake.txn_version(tables.aggregates, reduce_app_id(spec)) == partials)
        self.aggregates_read = lake.version(tables.aggregates) if self.reduced else None
        self.meta = {"run_id": run_id, "job": "apply", "spec_version": target.version,
                     "dropped_keys": diff.dropped_keys, "coarsened": diff.coarsened}
        # the aggregates whose stored columns carry over: the new spec's, minus the ones added or changed
        kept = tuple(a for a in spec.aggregates if a.name not in diff.added)
        self.kept = CompiledAggregates(dataclasses.replace(spec, aggregates=kept, rollups=()), target)
        self.compiled = CompiledAggregates(spec, target)
        # the columns of added or changed aggregates: NULL in every row kept (a changed one's old values go)
        self.fresh = {c for b in self.compiled.entries if b.name in diff.added for c in (b.name, *b.acc_columns)}

    def run(self) -> dict[str, int | None]:
        t = self.tables
        # without a rewrite the tables only gain columns, and so does the log (it keeps those of what was dropped)
        for name, path, step in (("state", t.stream_state, self._state), ("partials", t.partials, self._partials),
                                 ("aggregates", t.aggregates, self._aggregates), ("changelog", t.changelog, None)):
            self._step(name, path, step if self.diff.reset or self.diff.derives else None)
        if (told := changelog_feed.tell_commits(self.lake, self.spec, run_id=self.run_id)) is not None:  # re-derived
            self.written["changelog"] = told
        for name in self.diff.rollups_removed:
            storage.delete_tree(t.rollup(name))
        for rollup in self.spec.rollups:
            self._step(rollup.table, t.rollup(rollup.name), partial(self._rollup, rollup))
        return self.written

    def _step(self, name: str, path: str, step: Callable[[str, int | None], int | None] | None) -> None:
        """``step(path, version)`` (None: ``name``'s new columns added) on a table an earlier run has not done."""
        if not is_table(path):
            return
        at = table_spec_version(path, self.spec.name)
        if at is None or at < self.version:
            run = step or (lambda path, _: self._add_columns(path, name))
            self.written[name] = retry_conflicts(lambda attempt: run(path, self.lake.version(path)),
                                                 what=f"apply to {name}")

    # ------------------------------------------------------------------ helpers
    def _merges(self) -> bool:
        """Rows merge (keys dropped, windows coarsened or removed), not only columns dropped."""
        return bool(self.diff.dropped_keys or self.diff.coarsened or self.diff.window_removed)

    def _add_columns(self, path: str, table: str, rollup: RollupSpec | None = None,
                     txns: tuple[AppTxn, ...] = ()) -> int | None:
        have = set((self.lake.schema(path) or pa.schema([])).names)
        fields = [f for f in table_schema(self.spec, table, rollup) if f.name not in have]
        return self.lake.add_columns(path, fields, app_txns=txns or [self.txn]).version

    def _rollup_stands(self, rollup: RollupSpec, path: str, read: int | None) -> bool:
        """Whether a rollup's rows stand: its grain and keys are unchanged (each row merges the same events whatever
        ``aggregates``' windows and dropped keys), and it had merged an ``aggregates`` that had merged every partial."""
        changed = any(c.field == f"rollups[{rollup.name}]" for c in self.diff.changes)
        if changed or self.diff.reset or self.diff.window_removed or self.aggregates_read is None or read is None:
            return False
        return self.lake.txn_version(path, rollup_app_id(self.spec, rollup), read) == self.aggregates_read

    def _rewrite(self, rows: pa.Table | DataFrame, path: str, read: int | None, *, partition_by: tuple[str, ...] = (),
                 extra: tuple[AppTxn, ...] = (), sort_by: list[str] | None = None,
                 cluster: Cluster | None = None) -> int | None:
        return self.lake.rewrite(rows, path, partition_by=partition_by, read_version=read, cluster=cluster,
                                 app_txns=[self.txn, *extra], metadata=self.meta, sort_by=sort_by or []).version

    def _empty(self, table: str) -> pa.Table:
        return table_schema(self.spec, table).empty_table()

    def _read(self, path: str, version: int | None) -> pa.Table | DataFrame:
        """A table's rows: in Spark when this apply merges there, else in Arrow."""
        return open_table(path, version).read() if self.spark is None else self.lake.read(path, version=version)

    def _conform(self, rows: _Rows, table: str, rollup: RollupSpec | None = None) -> _Rows:
        """``rows`` with ``table``'s columns in the new spec: added or changed aggregates' columns NULL."""
        schema = table_schema(self.spec, table, rollup)
        kept = set(rows.column_names if isinstance(rows, pa.Table) else rows.columns) - self.fresh
        if isinstance(rows, pa.Table):
            return pa.Table.from_arrays([rows.column(f.name).cast(f.type) if f.name in kept
                                         else pa.nulls(rows.num_rows, f.type) for f in schema], schema=schema)
        from pyspark.sql.pandas.types import from_arrow_type

        return rows.select(*((F.col(f.name) if f.name in kept else F.lit(None)).cast(from_arrow_type(f.type))
                             .alias(f.name) for f in schema))

    # ------------------------------------------------------------------- tables
    def _state(self, path: str, read: int | None) -> int | None:
        if self.diff.reset:
            return self._rewrite(self._empty("state"), path, read)
        old = self._read(path, read)
        if self.diff.coarsened or self.diff.window_removed:  # the state held only the open fine windows
            rows = self._rebuilt_state(path, read, old)
        else:
            rows = self._merged(old, extra_keys=[DAY], extra=[("max_event_time", "max")])
        if self.spec.source.op_column is not None:
            rows = rows.filter(pc.not_equal(rows.column("n_rows"), 0)) if isinstance(rows, pa.Table) else rows.where(
                "n_rows != 0")
        return self._rewrite(self._conform(rows, "state"), path, read, sort_by=[DAY, *self.spec.key_columns])

    def _rebuilt_state(self, path: str, read: int | None, old: _Rows) -> _Rows:
        """The new windows still open at the stream's watermark, merged from the stream's partials of the
        mini-batches the state holds (a batch committed to partials but not to the state is replayed by the
        stream, so it is left out)."""
        done = -1 if (txn := self.lake.txn_version(path, stream_app_id(self.spec), read)) is None else txn
        lag = dt.timedelta(seconds=self.spec.stream.watermark.seconds)
        if isinstance(old, pa.Table):
            high = pc.max(old.column("max_event_time")).as_py() if old.num_rows else None
            partials = open_table(self.tables.partials).read(filter=pc.field("source") == STREAM)
            ids = pc.cast(pc.utf8_slice_codeunits(partials.column("batch"), len("stream-")), pa.int64())
            rows = self._merged(partials.filter(pc.less_equal(ids, done)), extra_keys=[DAY], extra=[])
            rows = rows.append_column("max_event_time", pa.array([high] * rows.num_rows, TS))
            return rows if high is None else rows.filter(self.spec.window.is_open_arrow(rows, high - lag))
        high = (old.agg(F.max("max_event_time")).first() or [None])[0]
        stream = self.lake.read(self.tables.partials).where(F.col("source") == STREAM)
        ids = F.substring(F.col("batch"), len("stream-") + 1, 20).cast("bigint")
        merged = self._merged(stream.where(ids <= F.lit(done)), extra_keys=[DAY], extra=[])
        merged = merged.withColumn("max_event_time", F.lit(high).cast("timestamp"))
        return merged if high is None else merged.where(self.spec.window.is_open(high - lag))

    def _partials(self, path: str, read: int | None) -> int | None:
        if self.diff.reset:
            return self._rewrite(self._empty("partials"), path, read, partition_by=PARTIALS_PARTITIONS)
        snapshot = open_table(path, read) if self.spark is None else None
        if snapshot is None or not self._merges() or snapshot.reader_features:
            source = self.lake.read(path, version=read) if snapshot is None else snapshot.read()
            rows = self._merged(source, extra_keys=_PARTIAL_KEYS, extra=_PARTIAL_EXTRA)
            return self._rewrite(self._conform(rows, "partials"), path, read, partition_by=PARTIALS_PARTITIONS)
        schema = snapshot.schema()
        chunks = forked_map(lambda files: self._merged_files(path, files, schema),
                            _balanced(self.lake.files(path, read), 4 * cores()))
        merged = pa.concat_tables(chunks) if chunks else self._merged_files(path, [], schema)
        version = self._rewrite(self._conform(merged, "partials"), path, read, partition_by=PARTIALS_PARTITIONS)
        self.merged_partials = (version, merged)
        return version

    def _merged_files(self, path: str, files: list[DataFile], schema: pa.Schema) -> pa.Table:
        """Some data files of ``partials`` (whole partitions) merged, with each aggregate's value per row
        (``__value:<name>``: the reduce takes them when a row is its window's only one)."""
        merged, accs = self._merge(read_data_files(path, files, schema), extra_keys=_PARTIAL_KEYS, extra=_PARTIAL_EXTRA)
        assert accs is not None
        out = self._encoded(merged, accs, schema)
        for name, values in value_columns(merged, accs, self.kept.entries, self.kept.coverage).items():
            out = out.append_column(_VALUE + name, values)
        return out

    def _aggregates(self, path: str, read: int | None) -> int | None:
        partials = self.lake.version(self.tables.partials)
        extra = (AppTxn(reduce_app_id(self.spec), partials),) if partials is not None else ()
        if self.diff.reset:
            return self._rewrite(self._empty("aggregates"), path, read, extra=extra)
        files = self.lake.files(self.tables.partials, partials)
        cluster = window_cluster(self.spec, len({f.partition_values.get(DAY) for f in files}))
        rows: pa.Table | DataFrame | None
        if not self._merges() and not self.diff.reserved:  # only aggregates dropped: the rows stand, without them
            rows = self._read(path, read)
            if not self.reduced:  # the reduce it had not run merges the rewritten partials (all of them) next time
                extra = ()
        elif self.spark is not None:  # the reduce of the new partials (recorded as merged), as a full reduce does
            counted = self.lake.read_files(self.tables.partials, list(counted_files(files)), version=partials)
            rows = reduce(counted, self.kept, run_id=self.run_id)
        else:
            rows = self._reduced_merged(partials)
        return self._rewrite(self._conform(rows, "aggregates"), path, read, extra=extra, sort_by=sort_keys(self.spec),
                             cluster=cluster)

    def _rollup(self, rollup: RollupSpec, path: str, read: int | None) -> int | None:
        if not (self.diff.reset or self.diff.derives or self.diff.added):
            return self._add_columns(path, rollup.table, rollup)
        sort_by = ["window_start", *rollup.by]
        if self._rollup_stands(rollup, path, read):
            # the same events per bucket and rollup key: its rows stand, recorded as merged from the new aggregates
            merged = self.lake.version(self.tables.aggregates)
            assert merged is not None  # the rollup had merged a version of it
            app = AppTxn(rollup_app_id(self.spec, rollup), merged)
            if not self.diff.dropped:
                return self._add_columns(path, rollup.table, rollup, (self.txn, app))
            rows = self._conform(open_table(path, read).read(), rollup.table, rollup)
            return self._rewrite(rows, path, read, extra=(app,), sort_by=sort_by)
        source = open_table(self.tables.aggregates)
        rows = rollups.rollup_rows(source, self.compiled, rollup, None, run_id=self.run_id)
        return self._rewrite(self._conform(rows, rollup.table, rollup), path, read, sort_by=sort_by,
                             extra=(AppTxn(rollup_app_id(self.spec, rollup), source.version()),))

    # ------------------------------------------------------------ merges
    def _merged(self, rows: _Rows, *, extra_keys: list[str], extra: list[tuple[str, str]]) -> _Rows:
        """The kept aggregates' accumulators merged per ``extra_keys`` and the new keys and windows."""
        if isinstance(rows, pa.Table):
            return self._encoded(*self._merge(rows, extra_keys=extra_keys, extra=extra), rows.schema)
        if self.diff.window_removed:
            rows = rows.drop("window_start", "window_end")
        elif self.diff.coarsened:
            rows = self.spec.window.coarsen(rows)
        if not self._merges():
            return rows
        aggs = {c: getattr(F, how)(F.col(c)) for c, how in extra}
        return final_aggregate(rows, self.kept, extra_keys=extra_keys, extra_aggs=aggs).drop(*self.kept.value_names)

    def _merge(self, rows: pa.Table, *, extra_keys: list[str],
               extra: list[tuple[str, str]]) -> tuple[pa.Table, Merged | None]:
        """:func:`merge_groups` of ``rows`` in the new windows per ``extra_keys`` and the new keys; no merge
        (None) when only columns were dropped: the rows stand as they are."""
        if self.diff.window_removed:
            rows = rows.drop_columns(["window_start", "window_end"])
        elif self.diff.coarsened and rows.num_rows:
            rows = self.spec.window.coarsen_arrow(rows)
        if not self._merges():
            return rows, None
        return merge_groups(rows, [*extra_keys, *self.spec.key_columns], self.kept.entries, extra,
                            order=[*extra_keys, *sort_keys(self.spec)])

    def _encoded(self, merged: pa.Table, accs: Merged | None, schema: pa.Schema) -> pa.Table:
        if accs is None:
            return merged
        return pa.table({**dict(zip(merged.column_names, merged.columns, strict=True)),
                         **encoded_columns(merged, accs, self.kept.entries, schema, self.kept.coverage)})

    def _reduced_merged(self, partials: int | None) -> pa.Table:
        """The reduce from the partials this run merged (version ``partials``), when each key's window has one
        counted row there (a batch lake: one batch per day): its accumulators and values are the window's, so
        they are neither read back nor merged again. Otherwise :meth:`_reduced` reads and merges."""
        if self.merged_partials is None or self.merged_partials[0] != partials or not self.spec.window.serves_stored:
            return self._reduced(partials)
        rows = self.merged_partials[1]
        batch = pc.equal(rows.column("source"), BATCH)
        counted = pc.or_(batch, pc.invert(pc.is_in(rows.column(DAY), pc.unique(rows.column(DAY).filter(batch)))))
        if self.spec.source.op_column is not None:
            counted = pc.and_(counted, pc.not_equal(rows.column("n_rows"), 0))
        rows = rows.filter(counted)
        keys = list(self.spec.key_columns)
        if rows.select(keys).group_by(keys, use_threads=False).aggregate([]).num_rows != rows.num_rows:
            return self._reduced(partials)
        return self._stamped({c.removeprefix(_VALUE): rows.column(c) for c in rows.column_names}, rows.num_rows)

    def _reduced(self, partials: int | None) -> pa.Table:
        """``aggregates`` rows from the partials that count (the hybrid rule): the reduce, in Arrow."""
        days = sorted(dt.date.fromisoformat(d) for d in batch_days(self.lake.files(self.tables.partials, partials)))
        counted = (pc.field("source") == BATCH) | ~pc.field(DAY).isin(pa.array(days, pa.date32()))
        rows = open_table(self.tables.partials, partials).read(filter=counted if days else None)
        entries = self.kept.entries
        served = self.spec.window.serve_arrow(rows, self.spec.group_by)
        merged, accs = merge_groups(served, list(self.spec.key_columns), entries)
        if self.spec.source.op_column is not None:
            keep = pc.not_equal(merged.column("n_rows"), 0)
            merged = merged.filter(keep)
            accs = {k: v.filter(keep) if isinstance(v, Stored)
                    else [a for a, ok in zip(v, keep.to_pylist(), strict=True) if ok] for k, v in accs.items()}
        return self._stamped({**dict(zip(merged.column_names, merged.columns, strict=True)),
                              **value_columns(merged, accs, entries, self.kept.coverage),
                              **encoded_columns(merged, accs, entries, rows.schema, self.kept.coverage)},
                             merged.num_rows)

    def _stamped(self, columns: dict[str, Any], n: int) -> pa.Table:
        """``aggregates`` rows of ``columns``, stamped with the time and this run."""
        now = pa.scalar(dt.datetime.now(dt.UTC), TS)
        return pa.table({**columns, "updated_at": pa.repeat(now, n), "run_id": pa.repeat(pa.scalar(self.run_id), n)})


def _balanced(files: list[DataFile], chunks: int) -> list[list[DataFile]]:
    """The files in up to ``chunks`` lists of whole partitions, of about equal bytes (largest first, each to
    the lightest list): a merge never spans two lists."""
    partitions: dict[tuple[tuple[str, str | None], ...], list[DataFile]] = {}
    for f in files:
        partitions.setdefault(tuple(sorted(f.partition_values.items())), []).append(f)
    out: list[list[DataFile]] = [[] for _ in range(min(chunks, len(partitions)))]
    load = [0] * len(out)
    for group in sorted(partitions.values(), key=lambda g: -sum(f.size for f in g)):
        i = load.index(min(load))
        out[i].extend(group)
        load[i] += sum(f.size for f in group)
    return out
