"""How ``plan`` sorts spec changes (no lake, no Spark): settings, from the stored accumulators, raw data, refused."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_jobs.lake.spec_record import fingerprint, normalise
from spark_jobs.spec import load_spec, parse_spec
from spark_jobs.spec_plan import compare

SAMPLE = Path(__file__).resolve().parents[2] / "pipelines" / "page_views.yaml"


def raw() -> dict[str, Any]:
    return yaml.safe_load(SAMPLE.read_text())


def spec(r: dict[str, Any]) -> Any:
    return parse_spec(r, origin="test", base_dir=SAMPLE.parent)


def kinds(old: dict[str, Any], new: dict[str, Any]) -> dict[str, str]:
    return {c.field: c.kind for c in compare(spec(old), spec(new)).changes}


def test_the_same_spec_has_no_changes_and_the_record_reads_back_as_the_spec():
    s = load_spec(SAMPLE)
    assert compare(s, s).changes == ()
    again = parse_spec({**normalise(s), "lake": s.lake, "source": {**normalise(s)["source"], "path": s.source.path}})
    assert fingerprint(normalise(again)) == fingerprint(normalise(s))
    assert normalise(again) == normalise(s)


@pytest.mark.parametrize(("edit", "field", "kind"), [
    (lambda r: r["stream"].update(trigger="1 minute"), "stream.trigger", "settings"),
    (lambda r: r["stream"].update(max_files_per_batch=7), "stream.max_files_per_batch", "settings"),
    (lambda r: r["stream"].update(watermark="1 hour"), "stream.watermark", "settings"),
    (lambda r: r["rollups"].append({"name": "weekly", "grain": "1 week"}), "rollups[weekly]", "settings"),
    (lambda r: r["rollups"][0].update(grain="2 days"), "rollups[daily]", "stored"),
    (lambda r: r.pop("rollups"), "rollups[daily]", "stored"),
    (lambda r: r["aggregates"].pop(2), "aggregates[max_ms]", "stored"),
    (lambda r: r.update(window={"size": "1 day"}), "window", "stored"),
    (lambda r: r.pop("window") and r.pop("rollups"), "window", "stored"),
    (lambda r: r["aggregates"].append({"name": "p50_ms", "fn": "approx_percentile", "column": "duration_ms",
                                       "args": {"q": 0.5}}), "aggregates[p50_ms]", "raw"),
    (lambda r: r["aggregates"][2].update(fn="min"), "aggregates[max_ms]", "raw"),
    (lambda r: r["aggregates"][5].update(args={"q": 0.99}), "aggregates[p95_ms]", "raw"),
    (lambda r: r["group_by"].append("country"), "group_by", "raw"),
    (lambda r: r.update(window={"size": "30 minutes"}) or r.pop("rollups"), "window", "raw"),
    (lambda r: r.update(window={"size": "90 minutes"}) or r.pop("rollups"), "window", "raw"),
    (lambda r: r.update(window={"size": "1 hour", "slide": "30 minutes"}) or r.pop("rollups"), "window", "raw"),
    (lambda r: r.update(window={"gap": "30 minutes"}) or r.pop("rollups"), "window", "raw"),
    (lambda r: r["source"]["schema"].update(duration_ms="double"), "source.schema.duration_ms", "raw"),
    (lambda r: r["source"]["schema"].update(referrer="string"), "source.schema.referrer", "raw"),
])
def test_each_change_is_sorted(edit, field, kind):
    new = raw()
    edit(new)
    assert kinds(raw(), new).get(field) == kind


def test_a_dropped_key_is_derived_and_an_added_one_resets_the_layout():
    two = raw()
    two["group_by"] = ["page", "country"]
    two["rollups"] = [{"name": "daily", "grain": "1 day", "by": ["page"]}]
    one = copy.deepcopy(two)
    one["group_by"] = ["page"]
    drop = compare(spec(two), spec(one))
    assert drop.dropped_keys == ("country",) and drop.derives and not drop.reset and not drop.needs_raw
    add = compare(spec(one), spec(two))
    assert add.reset and not add.derives and add.needs_raw
    assert set(add.added) == {a["name"] for a in two["aggregates"]}  # every aggregate starts over


def test_coarsening_merges_whole_multiples_only():
    day = raw()
    day["window"] = {"size": "1 day"}
    assert compare(spec(raw()), spec(day)).coarsened
    back = compare(spec(day), spec(raw()))  # 1 day -> 1 hour: refined
    assert back.reset and not back.coarsened


def test_an_added_aggregate_only_adds_columns_and_a_changed_one_replaces_them():
    new = raw()
    new["aggregates"].append({"name": "min_ms", "fn": "min", "column": "duration_ms"})
    new["aggregates"][1]["column"] = "weight"  # total_ms now sums another column
    diff = compare(spec(raw()), spec(new))
    assert set(diff.added) == {"min_ms", "total_ms"} and diff.dropped == ("total_ms",)
    assert diff.derives and not diff.dropped_keys and not diff.coarsened  # a rewrite that empties total_ms's columns
    only_added = raw()
    only_added["aggregates"].append({"name": "min_ms", "fn": "min", "column": "duration_ms"})
    assert not compare(spec(raw()), spec(only_added)).derives  # columns added, no file rewritten


def test_order_changes_are_settings_only():
    new = raw()
    new["aggregates"].reverse()
    assert set(kinds(raw(), new).values()) == {"settings"}


def test_a_new_name_is_refused():
    new = raw()
    new["name"] = "page_hits"
    assert [c.kind for c in compare(spec(raw()), spec(new)).refused] == ["refused"]


def test_sessions_change_only_with_raw_data_and_are_recorded_with_their_gap():
    sessions = raw()
    sessions.pop("rollups")
    sessions["window"] = {"gap": "30 minutes"}
    longer = copy.deepcopy(sessions)
    longer["window"] = {"gap": "1 hour"}
    fewer_keys = copy.deepcopy(sessions)
    fewer_keys["group_by"] = []
    assert kinds(sessions, longer) == {"window": "raw"}
    assert kinds(sessions, fewer_keys) == {"group_by": "raw"}  # sessions are cut per key: they cannot be merged
    assert compare(spec(sessions), spec(fewer_keys)).reset
    assert normalise(spec(sessions))["window"] == {"gap": "30 minutes"}
    assert str(spec(sessions).window) == "sessions (gap 30 minutes)"
