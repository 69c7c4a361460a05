"""Pipeline spec: YAML in, frozen dataclasses out, every check done before Spark starts.

Errors are collected, not raised one at a time, so a user fixes a spec in one pass; each
names the field path, the bad value and the fix.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

import yaml

from spark_jobs.aggregates.registry import is_user_defined, validate_aggregate
from spark_jobs.durations import Duration, parse_duration
from spark_jobs.errors import SpecError
from spark_jobs.windows import Unwindowed, WindowKind, parse_window

__all__ = ["AggregateSpec", "Duration", "PipelineSpec", "RollupSpec", "SourceSpec", "StreamSpec", "WindowKind",
           "load_spec", "parse_duration", "parse_spec"]

SourceFormat = Literal["parquet", "json", "csv"]
BadFilePolicy = Literal["quarantine", "fail"]
NullKeyPolicy = Literal["group", "reject"]

# spec type name -> Spark SQL type name
TYPES: dict[str, str] = {"string": "string", "int": "int", "integer": "int", "long": "bigint", "bigint": "bigint",
                         "float": "float", "double": "double", "boolean": "boolean", "date": "date",
                         "timestamp": "timestamp"}
# Columns the tables own; aggregates and group keys may not take these names.
RESERVED_COLUMNS = frozenset({"batch", "source", "event_date", "window_start", "window_end", "n_rows", "run_id",
                              "created_at", "updated_at", "op", "batch_id", "seq"})
PARTITION_COLUMN = "event_date"
OPS = ("+I", "-U", "+U", "-D")  # a changelog source's row kinds; -U and -D retract

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class SourceSpec:
    path: str
    format: SourceFormat
    event_time: str
    schema: tuple[tuple[str, str], ...]  # (column, Spark SQL type), in declared order
    op_column: str | None = None  # set for a changelog (CDC) source: +I/+U accumulate, -U/-D retract
    # a landing file that cannot be read: recorded in dead_letter and left out (quarantine), or the job stops (fail)
    on_bad_file: BadFilePolicy = "quarantine"
    # a row whose group key is NULL: a group of its own, as SQL, Flink and Spark group it, or a reject
    null_keys: NullKeyPolicy = "group"

    @property
    def columns(self) -> dict[str, str]:
        return dict(self.schema)

    def partition_path(self, date: str) -> str:
        return f"{self.path.rstrip('/')}/{PARTITION_COLUMN}={date}"


@dataclass(frozen=True)
class AggregateSpec:
    name: str
    fn: str
    columns: tuple[str, ...] = ()
    args: tuple[tuple[str, Any], ...] = ()

    def arg(self, key: str, default: Any = None) -> Any:
        return dict(self.args).get(key, default)

    @property
    def user_defined(self) -> bool:
        return is_user_defined(self.fn)


@dataclass(frozen=True)
class RollupSpec:
    """A declared rollup: ``aggregates`` merged into buckets of ``grain`` per ``by`` keys, kept in
    the table ``rollup_<name>`` by reduce and the stream."""

    name: str
    grain: Duration
    by: tuple[str, ...]

    @property
    def table(self) -> str:
        return f"rollup_{self.name}"


@dataclass(frozen=True)
class StreamSpec:
    max_files_per_batch: int = 100
    trigger: Duration = Duration(5)
    watermark: Duration = Duration(600)


@dataclass(frozen=True)
class PipelineSpec:
    """A validated pipeline. Paths are absolute (relative ones resolve against the spec file)."""

    name: str
    source: SourceSpec
    group_by: tuple[str, ...]
    aggregates: tuple[AggregateSpec, ...]
    lake: str
    window: WindowKind = dataclasses.field(default_factory=Unwindowed)
    stream: StreamSpec = StreamSpec()
    rollups: tuple[RollupSpec, ...] = ()
    origin: str = "<memory>"

    @property
    def key_columns(self) -> tuple[str, ...]:
        """Group keys plus the window bounds: one row per value of these in ``aggregates``."""
        return self.group_by + self.window.bounds

    def with_paths(self, *, lake: str | None = None, source_path: str | None = None) -> PipelineSpec:
        source = self.source if source_path is None else dataclasses.replace(self.source, path=_abs(source_path, None))
        return dataclasses.replace(self, source=source, lake=self.lake if lake is None else _abs(lake, None))


SPECS_ENV = "SPARK_JOBS_PIPELINES"
_REPO_SPECS = Path(__file__).resolve().parents[1] / "pipelines"


def specs_folder() -> Path:
    """The folder of a deployment's specs (the DAGs', the lake page's): ``$SPARK_JOBS_PIPELINES``, else the repo's
    ``pipelines/``."""
    return Path(os.environ.get(SPECS_ENV) or _REPO_SPECS)


def spec_files(folder: Path) -> list[Path]:
    """Every spec file in ``folder``: ``*.yaml`` and ``*.yml``, sorted."""
    return sorted(p for pattern in ("*.yaml", "*.yml") for p in folder.glob(pattern) if p.is_file())


def load_spec(path: str | Path, *, lake: str | None = None, source_path: str | None = None) -> PipelineSpec:
    """Read and validate a spec file; ``lake``/``source_path`` override the file's paths."""
    origin = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SpecError(origin, [f"cannot read the spec file: {exc.strerror}; pass an existing YAML file"]) from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(filter(None, (getattr(exc, "context", None), getattr(exc, "problem", None)))) or str(exc)
        raise SpecError(origin, [f"not valid YAML{where}: {problem}; fix the YAML syntax there"]) from exc
    spec = parse_spec(raw, origin=origin, base_dir=Path(path).resolve().parent)
    return spec.with_paths(lake=lake, source_path=source_path)


def _abs(value: str, base_dir: Path | None) -> str:
    """A local path made absolute (a relative one against ``base_dir``, else the working directory); a URL as is."""
    return value if "://" in value else str(((base_dir or Path()) / Path(value).expanduser()).resolve())


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, field: str, message: str) -> None:
        self.problems.append(f"{field}: {message}")

    def mapping(self, value: Any, field: str, allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            self.add(field, f"expected a mapping with keys {', '.join(allowed)}, got {type(value).__name__} {value!r}")
            return {}
        for key in value:
            if key not in allowed:
                shown = key if isinstance(key, str) and _NAME.match(key) else repr(key)
                self.add(f"{field}.{shown}" if field else shown,
                         f"unknown field; allowed fields are {', '.join(allowed)}")
        for key in required:
            if key not in value or value[key] is None:
                self.add(f"{field}.{key}" if field else key, "is required")
        return dict(value)

    def duration(self, value: Any, field: str) -> Duration | None:
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.add(field, str(exc))
            return None


def parse_spec(raw: Any, *, origin: str = "<memory>", base_dir: Path | None = None) -> PipelineSpec:
    """Validate a spec mapping (as loaded from YAML) into a :class:`PipelineSpec`: each section's ``_check_*``
    helper adds to one :class:`_Checker`, so every problem of the spec is reported at once."""
    c = _Checker()
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        raise SpecError(origin, ["spec: the file is empty; a spec is a YAML mapping with name, source, group_by, "
                                 "window, aggregates and lake (start from pipelines/page_views.yaml)"])
    if not isinstance(raw, Mapping):
        raise SpecError(origin, [f"spec: expected a YAML mapping with name, source, group_by, window, aggregates and "
                                 f"lake, got {type(raw).__name__} {str(raw)[:80]!r}"])
    top = c.mapping(raw, "", ("name", "source", "group_by", "window", "aggregates", "stream", "rollups", "lake"),
                    ("name", "source", "group_by", "aggregates", "lake"))
    name = top.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
        c.add("name", f"bad name {name!r}; use lower-case letters, digits and '_', starting with a letter, e.g. "
                      "page_views")
    src, schema = _check_source(c, top.get("source", {}))
    op_column = src.get("op_column")
    keys = _check_group_by(c, top.get("group_by"), schema)
    window, problems = parse_window(top.get("window"), retracting=op_column is not None)
    c.problems += [f"{where}: {message}" for where, message in problems]
    aggregates = _check_aggregates(c, top.get("aggregates"), schema, op_column)
    stream = _check_stream(c, top.get("stream"))
    rollups = _check_rollups(c, top.get("rollups"), keys, window)
    lake = top.get("lake")
    for field, value in (("lake", lake), ("source.path", src.get("path"))):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            c.add(field, f"expected a path, got {value!r}")

    if c.problems:
        raise SpecError(origin, c.problems)
    source = SourceSpec(path=_abs(src["path"], base_dir), format=cast(SourceFormat, src.get("format", "parquet")),
                        event_time=cast(str, src.get("event_time")), schema=tuple(schema.items()),
                        op_column=cast(str | None, op_column),
                        on_bad_file=cast(BadFilePolicy, src.get("on_bad_file", "quarantine")),
                        null_keys=cast(NullKeyPolicy, src.get("null_keys", "group")))
    return PipelineSpec(name=cast(str, name), source=source, group_by=keys, aggregates=tuple(aggregates),
                        lake=_abs(cast(str, lake), base_dir), window=cast(WindowKind, window), stream=stream,
                        rollups=tuple(rollups), origin=origin)


def _check_source(c: _Checker, raw: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``source`` mapping as given, and its schema as column -> Spark SQL type (valid columns only)."""
    src = c.mapping(raw, "source", ("path", "format", "event_time", "schema", "op_column", "on_bad_file",
                                    "null_keys"), ("path", "event_time", "schema"))
    fmt = src.get("format", "parquet")
    if fmt not in get_args(SourceFormat):
        c.add("source.format", f"unknown format {fmt!r}; use one of {', '.join(get_args(SourceFormat))}")
    policies = {"on_bad_file": (get_args(BadFilePolicy), "quarantine (record an unreadable landing file in "
                                "dead_letter and go on) or fail (stop the job, naming the file)"),
                "null_keys": (get_args(NullKeyPolicy), "group (a NULL group key is a group of its own, as in SQL) "
                              "or reject (the row goes to dead_letter)")}
    for key, (allowed, use) in policies.items():
        if key in src and src[key] not in allowed:
            c.add(f"source.{key}", f"unknown policy {str(src[key])[:40]!r}; use {use}")
    schema = _check_schema(c, src.get("schema"))
    _check_typed_column(c, "source.event_time", src.get("event_time"), schema, "timestamp")
    op_column = src.get("op_column")
    _check_typed_column(c, "source.op_column", op_column, schema, "string", f" holding {', '.join(OPS)}")
    for col in schema:
        if col in RESERVED_COLUMNS and col != op_column:  # the op column is consumed, never stored
            c.add(f"source.schema.{col}", f"{col!r} is reserved by the pipeline tables; rename the column")
    return src, schema


def _check_schema(c: _Checker, raw_schema: Any) -> dict[str, str]:
    schema: dict[str, str] = {}
    if raw_schema is not None and not isinstance(raw_schema, Mapping):
        c.add("source.schema", "expected a mapping of column: type, e.g. {event_time: timestamp, page: string}")
    elif raw_schema is not None and not raw_schema:
        c.add("source.schema", "is empty; declare each column the jobs read, e.g. {event_time: timestamp, "
                               "page: string}")
    elif raw_schema:
        for col, typ in raw_schema.items():
            if not isinstance(col, str) or not _NAME.match(col):
                c.add(f"source.schema.{col}", "bad column name; use lower-case letters, digits and '_'")
            elif str(typ).lower() not in TYPES:
                c.add(f"source.schema.{col}", f"unknown type {typ!r}; use one of {', '.join(TYPES)}")
            else:
                schema[col] = TYPES[str(typ).lower()]
    return schema


def _check_typed_column(c: _Checker, field: str, column: Any, schema: dict[str, str], type_: str,
                        hint: str = "") -> None:
    """A column the source names (event time, op column) must be in the schema with type ``type_``."""
    if column is None:
        return
    if not isinstance(column, str):
        c.add(field, f"expected a column name, got {type(column).__name__} {column!r}; e.g. {field.split('.')[-1]}: ts")
    elif schema and column not in schema:
        c.add(field, f"column {column!r} is not in source.schema; add it as {column}: {type_}")
    elif schema and schema[column] != type_:
        c.add(field, f"column {column!r} has type {schema[column]}; declare it as {type_}{hint}")


def _check_group_by(c: _Checker, group_by: Any, schema: dict[str, str]) -> tuple[str, ...]:
    if group_by is None:
        return ()
    if not isinstance(group_by, list) or not all(isinstance(k, str) for k in group_by):
        c.add("group_by", f"expected a list of column names, got {group_by!r}")
        return ()
    keys = tuple(group_by)
    for k in keys:
        if schema and k not in schema:
            c.add("group_by", f"column {k!r} is not in source.schema; add it or remove it from group_by")
    if len(set(keys)) != len(keys):
        c.add("group_by", f"duplicate columns in {list(keys)}; list each column once")
    return keys


def _check_aggregates(c: _Checker, raw_aggs: Any, schema: dict[str, str], op_column: str | None) -> list[AggregateSpec]:
    """The aggregates list; each entry is checked by shape, then by its function (built-in or user-defined)."""
    aggregates: list[AggregateSpec] = []
    if raw_aggs is not None and (not isinstance(raw_aggs, list) or not raw_aggs):
        c.add("aggregates", "expected a non-empty list, e.g. [{name: views, fn: count}]")
    seen: set[str] = set()
    for i, item in enumerate(raw_aggs if isinstance(raw_aggs, list) else []):
        field = f"aggregates[{i}]"
        if (agg := _check_aggregate_entry(c, field, item, schema, seen)) is not None:
            c.problems += [f"{field}.{where}: {message}" for where, message in validate_aggregate(
                agg.fn, agg.columns, dict(agg.args), schema, retracting=op_column is not None)]
            aggregates.append(agg)
    return aggregates


def _check_aggregate_entry(c: _Checker, field: str, item: Any, schema: dict[str, str],
                           seen: set[str]) -> AggregateSpec | None:
    """One ``aggregates[i]`` mapping as an :class:`AggregateSpec`; None when it has no usable ``fn``. Adds its
    name to ``seen``, so a later entry with the same name is reported."""
    a = c.mapping(item, field, ("name", "fn", "column", "columns", "args"), ("name", "fn"))
    if (agg_name := a.get("name")) is not None:
        if not isinstance(agg_name, str) or not _NAME.match(agg_name) or "__" in agg_name:
            c.add(f"{field}.name", f"bad name {agg_name!r}; use lower-case letters, digits and single '_'")
        elif agg_name in RESERVED_COLUMNS or agg_name in schema or agg_name in seen:
            c.add(f"{field}.name", f"name {agg_name!r} clashes with a column or another aggregate; choose a unique "
                                   "name")
        seen.add(str(agg_name))
    if "column" in a and "columns" in a:
        c.add(field, "'column' and 'columns' are mutually exclusive; define only one")
    cols_raw = a.get("columns", [a["column"]] if a.get("column") is not None else [])
    if not isinstance(cols_raw, list) or not all(isinstance(x, str) for x in cols_raw):
        c.add(f"{field}.columns", f"expected a list of column names, got {cols_raw!r}")
        cols_raw = []
    for col in cols_raw:
        if schema and col not in schema:
            c.add(f"{field}.column", f"column {col!r} is not in source.schema; add it or use another column")
    args = a.get("args") or {}
    if not isinstance(args, Mapping):
        c.add(f"{field}.args", f"expected a mapping, got {args!r}")
        args = {}
    elif not all(isinstance(k, str) for k in args):
        c.add(f"{field}.args", f"argument names must be strings, got {[k for k in args if not isinstance(k, str)]!r}; "
                               "e.g. args: {q: 0.95}")
        args = {}
    fn = a.get("fn")
    if not isinstance(fn, str):
        if fn is not None:
            c.add(f"{field}.fn", f"expected a function name, got {fn!r}")
        return None
    return AggregateSpec(str(agg_name), fn, tuple(cols_raw), tuple(sorted(args.items())))


def _check_stream(c: _Checker, raw: Any) -> StreamSpec:
    s = c.mapping({} if raw is None else raw, "stream", ("max_files_per_batch", "trigger", "watermark"))
    mfpb = s.get("max_files_per_batch", 100)
    if not isinstance(mfpb, int) or isinstance(mfpb, bool) or mfpb < 1:
        c.add("stream.max_files_per_batch", f"bad value {mfpb!r}; use a whole number >= 1")
    kwargs: dict[str, Any] = {"max_files_per_batch": mfpb}  # a bad value is never used: the spec is refused
    for key in ("trigger", "watermark"):
        if key in s and (duration := c.duration(s[key], f"stream.{key}")) is not None:
            kwargs[key] = duration
    return StreamSpec(**kwargs)


def _check_rollups(c: _Checker, raw: Any, keys: tuple[str, ...], window: WindowKind | None) -> list[RollupSpec]:
    """``rollups``: each a name, a grain that is a whole number of the window's tiles, and a subset of the group
    keys. A bad ``window`` (already reported) skips only the checks against the window."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        c.add("rollups", f"expected a list, e.g. [{{name: daily, grain: 1 day, by: [page]}}], got {raw!r}")
        return []
    if raw and window is not None and window.tile is None:
        c.add("rollups", window.rollup_refusal)
        return []
    tile = window.tile if window is not None else None
    out: list[RollupSpec] = []
    for i, item in enumerate(raw):
        field = f"rollups[{i}]"
        r = c.mapping(item, field, ("name", "grain", "by"), ("name", "grain"))
        name, by = r.get("name"), r.get("by", list(keys))
        if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
            c.add(f"{field}.name", f"bad name {name!r}; use lower-case letters, digits and '_', e.g. daily")
        elif name in {x.name for x in out}:
            c.add(f"{field}.name", f"rollup {name!r} is declared twice; give each rollup its own name")
        grain = c.duration(r["grain"], f"{field}.grain") if r.get("grain") is not None else None
        if grain is not None and tile is not None and grain.seconds % tile.seconds:
            c.add(f"{field}.grain", f"grain {grain} is not a whole number of {tile} windows; a window would "
                                    "fall in two buckets")
        if grain is not None and tile is not None and grain.seconds % (7 * 86400) == 0 and (
                4 * 86400) % tile.seconds:  # weeks start on Monday, 4 days after the epoch's windows
            c.add(f"{field}.grain", f"weekly buckets start on Monday, which cuts a {tile} window (windows "
                                    "count from Thursday 1970-01-01); use a grain of whole days")
        if not isinstance(by, list) or not all(isinstance(k, str) for k in by):
            c.add(f"{field}.by", f"expected a list of group keys, got {by!r}")
            by = []
        for k in by:
            if k not in keys:
                c.add(f"{field}.by", f"{k!r} is not a group key; use a subset of group_by {list(keys)}")
        if isinstance(name, str) and _NAME.match(name) and grain is not None:
            out.append(RollupSpec(name, grain, tuple(by)))
    return out
