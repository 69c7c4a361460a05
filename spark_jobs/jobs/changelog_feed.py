"""Every commit to ``aggregates`` told in ``changelog``, not only the stream's.

The stream tells its own batches (it holds their rows before and after, and orders them by first event). Every
other commit to ``aggregates`` is told after it lands, from the commit itself: a reduce (a combined day superseding
streamed values, late rows recounted, a backfill, ``--full``, sessions merged or split) and an ``apply``. The rows
of the files a commit removed are the served rows before it, those of the files it added the rows after; the one
changelog rule (:mod:`spark_jobs.phases.changelog_rule`) gives the change, and a row rewritten unchanged gives none.
Every row carries its writer, run and the ``aggregates`` version it tells: folding the log in
(``aggregates_version``, ``seq``) order gives ``aggregates`` as of each version.

Exactly once, as the rollups: the app transaction ``<pipeline>.changelog`` on ``changelog`` records the last
``aggregates`` version told. A run tells every commit after it but the stream's, in one commit planned from the
changelog's version (of two racing runs, the later conflicts, then finds the work done). A stop between a writer's
``aggregates`` commit and this one leaves the log behind until the next reduce, apply or stream start. A commit
that can no longer be read (its log cleaned up, a removed file vacuumed) is skipped with a warning.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.jobs.conflicts import retry_conflicts
from spark_jobs.lake import AppTxn, Lake, PipelineTables
from spark_jobs.lake.layout import CHANGE_STAMP, table_schema, value_fields
from spark_jobs.lake.reader import READ_ERRORS, CommitFiles, Snapshot, commit_files, open_table
from spark_jobs.lake.table_rules import changelog_app_id
from spark_jobs.lake.time_chunks import in_ranges, time_chunks
from spark_jobs.phases.arrow_merge import bucket_floor
from spark_jobs.phases.changelog_rule import ChangelogRule
from spark_jobs.spec import PipelineSpec

__all__ = ["STREAM_JOB", "tell_commits"]

log = logging.getLogger("spark_jobs")
STREAM_JOB = "stream"  # the ``job`` of the stream's commits: it tells them itself
DAY_S = 86_400  # a commit is told a run of days of windows at a time
RESCAN = 100  # commits with nothing to tell (the stream's) scanned again by each run, before one records them


def tell_commits(lake: Lake, spec: PipelineSpec, *, run_id: str, settle: bool = False) -> int | None:
    """Tell every commit to ``aggregates`` since the last one told; the changelog version written (None: none).
    ``settle``: record them as told even with nothing to tell, so that no later run tells them by another rule."""
    return retry_conflicts(partial(_attempt, lake, spec, run_id, settle), what="changelog")


def _attempt(lake: Lake, spec: PipelineSpec, run_id: str, settle: bool, attempt: int) -> int | None:
    tables = PipelineTables(spec.lake, spec.name)
    latest = lake.version(tables.aggregates)
    if latest is None:
        return None
    have = lake.schema(tables.changelog)  # None: no log yet
    missing = [f for f in CHANGE_STAMP if f.name not in have.names] if have is not None else []
    if missing:  # a log from before the stamp columns gains them (NULL in its rows)
        lake.add_columns(tables.changelog, missing)
    planned = lake.version(tables.changelog)
    app = changelog_app_id(spec)
    done = None if planned is None else lake.txn_version(tables.changelog, app, planned)
    first = 0 if done is None else done + 1
    if first > latest:
        return None
    aggregates = open_table(tables.aggregates, latest)
    rule = ChangelogRule.of(spec, [f.name for f in value_fields(spec)])
    schema = table_schema(spec, "changelog")  # and the columns of keys dropped since, which the log keeps
    schema = pa.schema([*schema, *(f for f in have or [] if f.name not in schema.names)])
    told = [_told(aggregates, rule, schema, v) for v in range(first, latest + 1)]
    rows = pa.concat_tables([t for t in told if t is not None] or [schema.empty_table()], promote_options="default")
    if not rows.num_rows and latest - first < RESCAN and not settle:  # nothing to tell: a rerun changes no table
        return None
    commit = lake.append(rows, tables.changelog, app_txn=AppTxn(app, latest), read_version=planned, conform=True,
                         metadata={"run_id": run_id, "job": "changelog", "aggregates_version": latest, "aggregates_told": done})
    log.info("changelog: aggregates versions %s-%s told (%s rows), version %s", first, latest, rows.num_rows,
             commit.version)
    return commit.version


def _told(aggregates: Snapshot, rule: ChangelogRule, schema: pa.Schema, version: int) -> pa.Table | None:
    """The changelog rows of one commit but the stream's: its removed files' rows before, its added files' after."""
    commit = commit_files(aggregates.path, version)
    if commit is None:
        log.warning("cannot read commit %s of %s (its log is cleaned up): the changelog does not tell it", version,
                    aggregates.path)
        return None
    if commit.info.get("job") == STREAM_JOB or not (commit.added or commit.removed):
        return None
    columns = [*rule.identity, *rule.values, "n_rows"]
    dropped = json.loads(commit.info.get("dropped_keys") or "[]")  # apply's: keys the removed files still hold
    writer = commit.info.get("job") or str(commit.info.get("operation", "")).lower()
    stamp = {"batch_id": None, "writer": writer, "run_id": commit.info.get("run_id"),
             "aggregates_version": commit.version}
    try:  # a key dropped or the windows coarsened: no row keeps its name
        if dropped or json.loads(commit.info.get("coarsened") or "false"):
            after = aggregates.read_files(commit.added, columns)
            before = aggregates.read_files(commit.removed, [*columns, *dropped], [schema.field(k) for k in dropped])
            return rule.replaced(before, after, stamp, schema, dropped)
        return rule.joined([rule.arrow(aggregates.read_files(removed, columns, filter=where),
                                       aggregates.read_files(added, columns, filter=where), None, stamp, schema)
                            for removed, added, where in _pieces(aggregates, commit)])
    except READ_ERRORS as exc:
        log.warning("cannot read the files of commit %s of %s (%s): the changelog does not tell it", commit.version,
                    aggregates.path, exc)
        return None


def _pieces(aggregates: Snapshot, commit: CommitFiles) -> list[tuple[list[str], list[str], pc.Expression | None]]:
    """The commit's removed and added files, a few days of windows at a time (:mod:`spark_jobs.lake.time_chunks`): a
    full reduce rewrites every row, and its change is told holding a few days' rows at once."""
    files = [*commit.removed, *commit.added]
    if "window_start" not in aggregates.schema().names or (chunks := time_chunks(
            aggregates.spans("window_start", files), lambda t: bucket_floor(t, DAY_S), dt.timedelta(seconds=DAY_S))) is None:
        return [(list(commit.removed), list(commit.added), None)]
    at = dict(zip(aggregates.uris(files), files, strict=True))
    return [([f for f in commit.removed if f in mine], [f for f in commit.added if f in mine], in_ranges("window_start", c.ranges))
            for c in chunks if (mine := {at[u] for u in c.uris})]
