"""Hand-off records: what a restart replays, and what it leaves."""

from __future__ import annotations

from spark_jobs.stream.handoff import Handoffs


def test_a_restart_replays_the_records_after_the_states_batch_in_order(tmp_path):
    handoffs = Handoffs(str(tmp_path / "checkpoint"))
    assert handoffs.pending(None) == []  # no directory yet
    handoffs.record(3, ["/l/c.parquet"])
    handoffs.record(2, ["/l/a.parquet", "/l/b.parquet"])
    (tmp_path / "checkpoint" / "handoff" / ".4.json.tmp").write_text('{"batch_id": 4, "fi')  # a write cut short
    assert handoffs.pending(None) == [(2, ["/l/a.parquet", "/l/b.parquet"]), (3, ["/l/c.parquet"])]
    assert handoffs.pending(2) == [(3, ["/l/c.parquet"])]
    handoffs.forget(2)
    assert handoffs.pending(None) == [(3, ["/l/c.parquet"])]
    handoffs.forget(None)  # a state without commits covers nothing
    assert handoffs.pending(1) == [(3, ["/l/c.parquet"])]
    handoffs.forget(3)
    assert handoffs.pending(None) == []
