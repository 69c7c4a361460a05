"""``explain`` shows each phase's algebra, from the aggregate classes, and Spark's plan of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.__main__ import main

pytestmark = pytest.mark.spark

SAMPLE = Path(__file__).resolve().parents[2] / "pipelines" / "page_views.yaml"


def test_explain_prints_every_aggregate_and_the_physical_plan_of_each_phase(spark, tmp_path, capfd):
    assert main(["explain", "--pipeline", str(SAMPLE), "--lake", str(tmp_path)]) == 0
    out = capfd.readouterr().out
    for phase, operator in (("combine", "LocalGroupAggregate"), ("reduce", "GlobalGroupAggregate"),
                            ("stream", "MiniBatchLocalGroupAggregate")):
        assert f"page_views: {phase} = {operator}" in out
        assert f"== Spark's physical plan of {phase} ==" in out
    assert "stored as:       views__count" in out and "global (reduce): sum(views__count)" in out
    assert "stored as:       users__hll" in out and "hll_union_agg" in out
    assert "mapInArrow: WeightedAvg.accumulate_batch(duration_ms, weight)" in out
    assert out.count("HashAggregate") >= 3  # Spark's plan of each phase, not just our text
    assert "group by: event_date, page, window_start, window_end" in out


def test_explain_of_an_unknown_phase_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["explain", "--pipeline", str(SAMPLE), "merge"])
    assert exit_.value.code == 2
    assert "invalid choice: 'merge'" in capsys.readouterr().err
