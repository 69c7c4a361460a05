"""The changelog rule, once, in its Spark and Arrow forms (a property test holds the two equal).

Each served row's values before and after a mini-batch give its change, as Flink's retracting group aggregation emits
them: a new row ``+I`` (new values); a changed row ``-U`` (old values) then ``+U`` (new values); a row whose row count
falls to zero, or that is gone, ``-D`` (old values); an unchanged row nothing. A row that is missing or has a row count
of zero does not exist. A served row is named by the window kind's identity columns (a session by its key and start: one
that grew keeps its name, ``-U`` with its old end and ``+U`` with its new one; one absorbed by another, or whose start a
merge moved, is deleted and the merged one inserted or updated under its own start). ``seq`` orders the rows within the
change: by the first event of their group key in a stream's batch (when known), then by identity, ``-U`` before ``+U``.
Every writer of ``aggregates`` tells its changes with this rule: the stream for its batches, and
:mod:`spark_jobs.jobs.changelog_feed` for every other commit; ``stamp`` names the writer."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.key_match import arrow_join, join_on_keys
from spark_jobs.spark_functions import F
from spark_jobs.windows.kind import TS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from spark_jobs.spec import PipelineSpec

__all__ = ["ChangelogRule", "FIRST_SEEN"]

FIRST_SEEN = "_first_seen"
_ORDER = "_order"


@dataclass(frozen=True)
class ChangelogRule:
    """The rule over one pipeline's served rows: ``identity`` names a row, ``values`` are compared (with
    ``n_rows``), ``group`` orders the rows by its first event, ``columns`` are the changelog's own."""

    identity: tuple[str, ...]
    values: tuple[str, ...]
    group: tuple[str, ...]
    columns: tuple[str, ...]  # the key columns and value columns the changelog stores, in its order

    @classmethod
    def of(cls, spec: PipelineSpec, values: Sequence[str]) -> ChangelogRule:
        """The rule of a pipeline whose served rows have the aggregates' ``values``."""
        return cls(tuple(spec.window.identity(spec.group_by)), (*spec.window.changelog_values, *values),
                   spec.group_by, (*spec.key_columns, *values))

    def spark(self, before: DataFrame, after: DataFrame, first_seen: DataFrame, stamp: Mapping[str, Any], *,
              small: bool = False) -> DataFrame:
        """``before`` and ``after``: identity and value columns with ``n_rows``; ``first_seen``: group key columns
        and ``_first_seen``; ``stamp``: the constants every row of this change carries (batch_id, writer, run_id).
        ``small``: ``before`` and ``first_seen`` are broadcast, so ``after`` (a batch's new rows) is not shuffled."""
        from pyspark.sql import Window

        keys, names = list(self.identity), [*self.values]
        old = before.select(*keys, F.struct(*names, "n_rows").alias("_old"))
        new = after.select(*keys, F.struct(*names, "n_rows").alias("_new"))
        if small and keys:  # each row after with its row before, then the rows before that none after has
            held = F.broadcast(old)
            still = F.broadcast(join_on_keys(new.select(*keys), held, keys, "left_semi"))
            both = join_on_keys(new, held, keys, "left").unionByName(
                join_on_keys(old, still, keys, "left_anti"), allowMissingColumns=True)
        else:
            both = join_on_keys(old, new, keys, "full_outer") if keys else old.crossJoin(new)
        seen = F.broadcast(first_seen) if small else first_seen
        both = join_on_keys(both, seen, self.group, "left") if self.group else both.crossJoin(first_seen)
        same = F.lit(True)
        for name in names:
            same = same & F.col(f"_old.{name}").eqNullSafe(F.col(f"_new.{name}"))

        def entry(op: str, order: int, side: str) -> Any:
            return F.struct(F.lit(op).alias("op"), F.lit(order).alias(_ORDER),
                            *(F.col(f"{side}.{n}").alias(n) for n in names))

        was = F.col("_old").isNotNull() & (F.col("_old.n_rows") != 0)
        gone = F.col("_new").isNull() | (F.col("_new.n_rows") == 0)
        ops = (F.when(~was & ~gone, F.array(entry("+I", 0, "_new")))
               .when(was & gone, F.array(entry("-D", 0, "_old")))
               .when(was & ~same, F.array(entry("-U", 0, "_old"), entry("+U", 1, "_new")))
               .otherwise(F.array()))
        rows = both.select(*keys, FIRST_SEEN, F.explode(ops).alias("_c")).select(*keys, FIRST_SEEN, "_c.*")
        order = Window.orderBy(F.col(FIRST_SEEN).asc_nulls_first(), *keys, _ORDER)
        stamped = {k: F.lit(v).cast("bigint" if k == "batch_id" else "string").alias(k) for k, v in stamp.items()}
        batch = [stamped.pop("batch_id")] if "batch_id" in stamped else []
        seq = (F.row_number().over(order) - 1).cast("bigint").alias("seq")
        return rows.select("op", *self.columns, *batch, seq, *stamped.values())  # the changelog's column order

    def arrow(self, before: pa.Table, after: pa.Table, first_seen: pa.Table | None, stamp: Mapping[str, Any],
              schema: pa.Schema) -> pa.Table:
        """The Arrow form of :meth:`spark`, as ``schema`` (the changelog table's) lays out the columns it has;
        ``first_seen`` None: the change comes from no batch of events, its rows go in identity order."""
        both = _matched(before, after, list(self.identity))
        was, gone = _present(before, both, "_o"), pc.invert(_present(after, both, "_n"))
        changed = np.asarray(pc.and_(was, pc.invert(gone)).to_numpy(zero_copy_only=False), dtype=bool)  # both sides
        changed[changed] = ~self._same(before, after, both.filter(changed))  # their values alone compared: most are new
        old_at, new_at = both.column("_o"), pc.add(both.column("_n"), before.num_rows)  # rows of before, then after
        pieces = [_entries(both, pc.and_(pc.invert(was), pc.invert(gone)), "+I", 0, new_at),
                  _entries(both, pc.and_(was, gone), "-D", 0, old_at),
                  _entries(both, changed, "-U", 0, old_at), _entries(both, changed, "+U", 1, new_at)]
        # ordered as row numbers and keys, then each column taken once: strings taken at random cost the most
        index = self._first_seen(pa.concat_tables(pieces), first_seen)
        index = index.sort_by([(c, "ascending", "at_start") for c in (FIRST_SEEN, *self.identity, _ORDER)])
        rows = pa.concat_tables([before.select(self.columns), after.select(self.columns)]).take(index.column("_at"))
        return _laid_out(index.column("op"), rows, stamp, schema)

    def joined(self, pieces: Sequence[pa.Table]) -> pa.Table:
        """The changes :meth:`arrow` told (without ``first_seen``) in pieces of disjoint identities, as one telling of
        them all gives them: in identity order (a sort that keeps each identity's ``-U`` before its ``+U``), ``seq``
        counted again."""
        if len(pieces) == 1:
            return pieces[0]
        rows = pa.concat_tables(pieces)
        rows = rows.take(pc.sort_indices(rows, [(c, "ascending", "at_start") for c in self.identity]))
        return rows.set_column(rows.schema.get_field_index("seq"), rows.schema.field("seq"),
                               pa.array(np.arange(rows.num_rows, dtype=np.int64)))

    def replaced(self, before: pa.Table, after: pa.Table, stamp: Mapping[str, Any], schema: pa.Schema,
                 old_keys: Sequence[str]) -> pa.Table:
        """A change that renames every row (group keys dropped, ``old_keys``; or windows coarsened): each old row
        ``-D`` under its old name, then each new row ``+I``, which a consumer keyed either way folds (matched by the new
        identity alone, each old row would read as an update of the row it merged into). Both are ``aggregates`` rows:
        none has ``n_rows`` 0 (every writer drops a key retracted to nothing)."""
        rows = pa.concat_tables([before.select([*self.columns, *old_keys]), after.select(self.columns)],
                                promote_options="default")  # the new rows' old keys NULL
        ops = pa.concat_arrays([pa.repeat(pa.scalar(op), t.num_rows) for op, t in (("-D", before), ("+I", after))])
        return _laid_out(ops, rows, stamp, schema)

    def _same(self, before: pa.Table, after: pa.Table, both: pa.Table) -> np.ndarray:
        """Null-safe equality of every value (NaN equal to NaN), as Spark's ``eqNullSafe`` of the two sides."""
        same = np.ones(both.num_rows, dtype=bool)
        for name in self.values:
            a, b = before.column(name).take(both.column("_o")), after.column(name).take(both.column("_n"))
            try:
                eq = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
                if pa.types.is_floating(a.type):
                    eq = pc.or_(eq, pc.and_(pc.fill_null(pc.is_nan(a), False), pc.fill_null(pc.is_nan(b), False)))
                same &= np.asarray(eq.to_numpy(zero_copy_only=False), dtype=bool)
            except (pa.ArrowNotImplementedError, pa.ArrowTypeError):  # nested values: Python's equality
                same &= np.array([_equal(x, y) for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)], dtype=bool)
        return same

    def _first_seen(self, rows: pa.Table, first_seen: pa.Table | None) -> pa.Table:
        group = list(self.group)
        if first_seen is None or not group:  # none (the rows go in identity order), or one for every row
            seen = first_seen.column(FIRST_SEEN)[0].as_py() if first_seen is not None and first_seen.num_rows else None
            return rows.append_column(FIRST_SEEN, pa.repeat(pa.scalar(seen, TS), rows.num_rows))
        index = rows.append_column("_row", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
        joined = arrow_join(index.select([*group, "_row"]), first_seen, group, "left outer")
        order = np.argsort(joined.column("_row").to_numpy())
        return rows.append_column(FIRST_SEEN, joined.column(FIRST_SEEN).take(pa.array(order)))


def _matched(before: pa.Table, after: pa.Table, keys: list[str]) -> pa.Table:
    """Each identity once, with its row in ``before`` (``_o``) and in ``after`` (``_n``), NULL where absent: a join
    of the key columns and row numbers only (Arrow joins carry no list or map payload). ``before`` is the hashed
    (right) side: it holds the few served rows a batch touches, ``after`` every row the batch writes."""
    if not keys:
        return pa.table({"_o": pa.array([0] if before.num_rows else [None], pa.int64()),
                         "_n": pa.array([0] if after.num_rows else [None], pa.int64())})
    sides = [t.select(keys).append_column(name, pa.array(np.arange(t.num_rows, dtype=np.int64)))
             for t, name in ((before, "_o"), (after, "_n"))]
    return arrow_join(sides[1], sides[0], keys, "full outer", coalesce_keys=True)


def _present(side: pa.Table, both: pa.Table, index: str) -> pa.Array:
    """Whether the side holds the row with a row count other than zero."""
    rows = side.column("n_rows").take(both.column(index))
    return pc.fill_null(pc.not_equal(rows, 0), False)


def _entries(both: pa.Table, mask: pa.Array | np.ndarray, op: str, order: int, at: pa.ChunkedArray) -> pa.Table:
    """The matched identities under ``mask``, each with its row (``_at``) in before and after laid end to end."""
    rows = both.filter(mask)
    return rows.drop_columns(["_o", "_n"]).append_column("_at", at.filter(mask)).append_column(
        "op", pa.repeat(pa.scalar(op), rows.num_rows)).append_column(
        _ORDER, pa.repeat(pa.scalar(order, pa.int8()), rows.num_rows))


def _laid_out(ops: pa.Array | pa.ChunkedArray, rows: pa.Table, stamp: Mapping[str, Any], schema: pa.Schema) -> pa.Table:
    """The change's rows in ``seq`` order as ``schema`` (the changelog table's) lays out the columns it has."""
    out = {"op": ops, **{c: rows.column(c) for c in rows.column_names},
           "seq": pa.array(np.arange(rows.num_rows, dtype=np.int64)),
           **{k: pa.repeat(pa.scalar(v), rows.num_rows) for k, v in stamp.items()}}
    fields = [f for f in schema if f.name in out]
    return pa.table([out[f.name].cast(f.type) for f in fields], schema=pa.schema(fields))


def _equal(x: Any, y: Any) -> bool:
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
