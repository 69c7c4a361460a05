"""The Flink peer's harness without Flink: ``--peer`` parsing, the job's arguments per query, and its SQL's shape
(the events check reads the ``views`` column at one index for both queries)."""

from __future__ import annotations

import pytest

from benchmarks.__main__ import build_parser
from benchmarks.flink_job import VIEWS_COLUMN, session_sql, tumble_sql
from benchmarks.flink_peer import FlinkQuery


@pytest.mark.parametrize(("given", "peers"), [([], ("spark",)), (["--peer", "flink,spark"], ("flink", "spark")),
                                              (["--peer", "flink"], ("flink",)), (["--peer", "none"], ())])
def test_sessions_peers(given, peers):
    assert build_parser().parse_args(["sessions", *given]).peer == peers


@pytest.mark.parametrize("bad", ["flnk", "spark,none", ""])
def test_sessions_peer_refuses_unknown_names(bad, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sessions", "--peer", bad])
    assert "give spark and/or flink, comma-separated (e.g. spark,flink), or none" in capsys.readouterr().err


def test_the_job_arguments_name_the_query():
    assert FlinkQuery("tumble", 60).args() == ["--query", "tumble", "--window-minutes", "60"]
    assert FlinkQuery("session", 30).args() == ["--query", "session", "--gap-minutes", "30"]
    assert FlinkQuery("session", 30, percentile=False).args()[-1] == "--no-percentile"
    with pytest.raises(ValueError, match="bad Flink query 'hop' of 5 minutes: give tumble or session"):
        FlinkQuery("hop", 5)  # type: ignore[arg-type]


@pytest.mark.parametrize(("sql", "key"), [(tumble_sql(60), "page"), (session_sql(30), "user_id"),
                                          (session_sql(30, percentile=False), "user_id")])
def test_views_is_at_the_checked_column_and_every_column_is_selected(sql, key):
    columns, query = sql
    names = [c.split()[0].strip("`") for c in columns.split(", ")]
    assert names[0] == key and names[VIEWS_COLUMN] == "views"
    selected = query.split("SELECT", 1)[1].split("FROM", 1)[0]
    assert selected.count(",") + 1 - selected.count("0.95") == len(names)  # PERCENTILE's argument is no column


def test_the_session_query_is_per_user_with_the_gap():
    _, query = session_sql(30)
    assert "SESSION(TABLE events PARTITION BY user_id, DESCRIPTOR(event_time)" in query
    assert "INTERVAL '30' MINUTE" in query and "GROUP BY user_id, window_start, window_end" in query
    assert "PERCENTILE(duration_ms, 0.95)" in query and "PERCENTILE" not in session_sql(30, percentile=False)[1]
