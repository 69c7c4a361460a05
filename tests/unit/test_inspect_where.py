"""The ``--where`` filter language and the lake confinement of table names (no Spark)."""

from __future__ import annotations

import datetime as dt
import os

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from spark_jobs.errors import LakeError
from spark_jobs.inspection import InspectError, parse_where, resolve_table

UTC = dt.UTC
SCHEMA = pa.schema([("page", pa.string()), ("window_start", pa.timestamp("us", tz="UTC")), ("views", pa.int64()),
                    ("avg_ms", pa.float64()), ("event_date", pa.date32()), ("ok", pa.bool_()),
                    ("users__hll", pa.binary())])
ROWS = pa.table({
    "page": ["/a", "/b", None, "it's"],
    "window_start": [dt.datetime(2024, 3, 1, h, tzinfo=UTC) for h in (0, 1, 2, 3)],
    "views": [1, 5, 10, 7],
    "avg_ms": [1.5, None, 3.0, 4.0],
    "event_date": [dt.date(2024, 3, 1), dt.date(2024, 3, 1), dt.date(2024, 3, 2), dt.date(2024, 3, 2)],
    "ok": [True, False, True, None],
    "users__hll": [b"x"] * 4,
}, schema=SCHEMA)


@pytest.mark.parametrize(("text", "views"), [
    ("page = '/a'", [1]),
    ("page != '/a'", [5, 7]),
    ("page <> '/a'", [5, 7]),
    ("views >= 5 AND views < 10", [5, 7]),
    ("views > 6 or page = '/a'", [1, 10, 7]),
    ("(page = '/a' OR page = '/b') AND views > 1", [5]),
    ("NOT views = 5", [1, 10, 7]),
    ("page IN ('/a', '/b')", [1, 5]),
    ("page NOT IN ('/a')", [5, 7]),
    ("page IS NULL", [10]),
    ("avg_ms IS NOT NULL AND avg_ms > 2", [10, 7]),
    ("avg_ms > 1.5e0", [10, 7]),
    ("window_start >= '2024-03-01 02:00'", [10, 7]),
    ("window_start = '2024-03-01T01:00:00Z'", [5]),
    ("window_start < '2024-03-01 03:00:00+01:00'", [1, 5]),
    ("event_date = '2024-03-02'", [10, 7]),
    ("ok = TRUE", [1, 10]),
    ("page = 'it''s'", [7]),
    ("page = 'x''; DROP TABLE t; --'", []),
    ("views IN (1, 7) and page is not null", [1, 7]),
])
def test_filters_select_the_rows_sql_would(text, views):
    assert ROWS.filter(parse_where(text, SCHEMA))["views"].to_pylist() == views


@pytest.mark.parametrize(("text", "message"), [
    ("1=1", "position 1: expected a column name, found the number 1"),
    ("1=1; DROP TABLE t", "position 4: unexpected character ';'"),  # the text is tokenised first
    ("page = 'x' OR 1=1", "position 15: expected a column name, found the number 1"),
    ("page = 'x'; DROP TABLE t", "position 11: unexpected character ';'"),
    ("page = 'x' -- comment", "position 12: unexpected character '-'"),
    ("page = lower('X')", "position 8: column 'page' is string; expected a string in single quotes, found 'lower'"),
    ("pgae = '/a'", "position 1: unknown column 'pgae'"),
    ("users__hll = 'x'", "column 'users__hll' is binary, which cannot be filtered"),
    ("views = '5'", "column 'views' is int64; expected a number, found the string '5'"),
    ("views = 1.5", "expected a whole number, found 1.5"),
    ("views = NULL", "NULL cannot be compared with an operator"),
    ("page = 'abc", "position 8: this quoted string is never closed"),
    ("(views = 1", "expected ')' to close the parenthesis, found the end of the filter"),
    ("views = 1)", "expected AND, OR or the end of the filter, found ')'"),
    ("views", "expected an operator (=, !=, <, <=, >, >=, IN, IS NULL) after views"),
    ("views == 1", "expected a number, found '='"),
    ("page IS 'x'", "expected NULL after IS, found the string 'x'"),
    ("window_start > '2024-13-01'", "is not a valid date or time"),
    ("window_start > 'yesterday'", "'yesterday' is not a date or time"),
    ("event_date = '2024-03-01 10:00'", "column 'event_date' is a date; expected 'YYYY-MM-DD'"),
    ("ok = 1", "column 'ok' is boolean; expected TRUE or FALSE"),
    ("page = 'a' AND", "expected a column name, found the end of the filter"),
    ("", "empty filter"),
    ("(" * 40 + "views = 1" + ")" * 40, "nested more than 32 levels deep"),
    ("views = 1 OR " * 200 + "views = 1", "the limit is 2000"),
])
def test_bad_filters_name_the_position_and_the_fix(text, message):
    with pytest.raises(InspectError) as info:
        parse_where(text, SCHEMA)
    assert message in str(info.value)


def test_the_caret_points_at_the_bad_token():
    with pytest.raises(InspectError) as info:
        parse_where("views > 1 AND 2 = page", SCHEMA)
    lines = str(info.value).splitlines()
    assert lines[:3] == ["bad filter at position 15: expected a column name, found the number 2",
                         "  views > 1 AND 2 = page", "                ^"]
    assert lines[3].startswith("each condition starts with a column")


# ----------------------------------------------------------------------------- confinement
@pytest.fixture
def lake(tmp_path):
    root = tmp_path / "lake"
    write_deltalake(str(root / "p1" / "aggregates"), pa.table({"k": ["a"], "v": [1]}))
    outside = tmp_path / "outside"
    write_deltalake(str(outside / "aggregates"), pa.table({"k": ["b"], "v": [2]}))
    os.symlink(outside, root / "escape")
    return root


def test_qualified_names_resolve_inside_the_lake(lake):
    ref = resolve_table("p1.aggregates", str(lake), confined=True)
    assert (ref.pipeline, ref.table, ref.path) == ("p1", "aggregates", str(lake / "p1" / "aggregates"))


@pytest.mark.parametrize("name", ["../outside/aggregates", "/etc/passwd", "p1/../../outside/aggregates",
                                  "p1.aggregates/../..", "P1.aggregates", "p1.aggregates;", "", "p1."])
def test_the_web_view_accepts_no_paths(lake, name):
    with pytest.raises(InspectError, match=r"bad table name .*; use <pipeline>\.<table>"):
        resolve_table(name, str(lake), confined=True)


def test_a_symlink_out_of_the_lake_is_refused(lake):
    with pytest.raises(InspectError, match="resolves outside the lake root"):
        resolve_table("escape.aggregates", str(lake), confined=True)
    from spark_jobs.inspection import list_tables

    assert list_tables(str(lake))["table"].to_pylist() == ["p1.aggregates"]


def test_unknown_tables_and_pipelines(lake):
    with pytest.raises(LakeError, match=r"unknown table 'nope' in 'p1\.nope'; tables are partials, aggregates"):
        resolve_table("p1.nope", str(lake), confined=True)
    with pytest.raises(LakeError, match=r"no Delta table p2.aggregates at .* \(pipelines in .*: p1\)"):
        resolve_table("p2.aggregates", str(lake), confined=True)
