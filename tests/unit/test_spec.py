"""The pipeline spec: the sample file loads, and every rejection names the field and the fix."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.errors import SpecError
from spark_jobs.lake import PipelineTables
from spark_jobs.spec import Duration, PipelineSpec, load_spec, parse_duration, parse_spec
from spark_jobs.windows import Cumulative, Hopping, Sessions, Tumbling

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "pipelines" / "page_views.yaml"

BASE: dict[str, Any] = {
    "name": "page_views",
    "source": {
        "path": "landing/page_views",
        "format": "parquet",
        "event_time": "event_time",
        "schema": {
            "event_time": "timestamp",
            "user_id": "string",
            "page": "string",
            "duration_ms": "long",
            "weight": "double",
        },
    },
    "group_by": ["page"],
    "window": {"size": "1 hour"},
    "aggregates": [
        {"name": "views", "fn": "count"},
        {"name": "total_ms", "fn": "sum", "column": "duration_ms"},
    ],
    "lake": "lake",
}


def raw_spec(mutate: Callable[[dict[str, Any]], object] | None = None) -> dict[str, Any]:
    """A deep copy of the valid BASE spec, changed in place by ``mutate``."""
    raw = copy.deepcopy(BASE)
    if mutate is not None:
        mutate(raw)
    return raw


def add_agg(**agg: Any) -> Callable[[dict[str, Any]], None]:
    """Mutation appending one aggregate entry (it becomes aggregates[2])."""
    return lambda raw: raw["aggregates"].append(agg)


def parse(raw: dict[str, Any], tmp_path: Path) -> PipelineSpec:
    return parse_spec(raw, origin="t.yaml", base_dir=tmp_path)


# --- the sample spec ---------------------------------------------------------------------------


def test_sample_spec_loads() -> None:
    spec = load_spec(SAMPLE)
    assert spec.name == "page_views"
    assert spec.group_by == ("page",)
    assert spec.window == Tumbling(Duration(3600))
    assert len(spec.aggregates) == 8
    assert [a.name for a in spec.aggregates] == [
        "views", "total_ms", "max_ms", "avg_ms", "users", "p95_ms", "first_user", "weighted_ms",
    ]
    assert spec.aggregates[5].arg("q") == 0.95
    assert spec.aggregates[7].user_defined
    assert spec.aggregates[7].columns == ("duration_ms", "weight")
    assert spec.source.format == "parquet"
    assert spec.source.event_time == "event_time"
    assert spec.source.columns["duration_ms"] == "bigint"  # spec type 'long' -> Spark 'bigint'
    assert spec.stream.trigger.seconds == 5
    assert spec.stream.watermark.seconds == 600
    assert spec.key_columns == ("page", "window_start", "window_end")
    assert spec.origin == str(SAMPLE)


def test_sample_spec_paths_resolve_against_the_spec_directory() -> None:
    spec = load_spec(SAMPLE)
    assert Path(spec.source.path).is_absolute()
    assert Path(spec.lake).is_absolute()
    spec_dir = SAMPLE.parent.resolve()
    assert spec.source.path == str((spec_dir / "../data/landing/page_views").resolve())
    assert spec.lake == str((spec_dir / "../data/lake").resolve())


def test_relative_paths_resolve_against_the_spec_file_not_the_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    copy_ = spec_dir / "pv.yaml"
    copy_.write_text(SAMPLE.read_text())
    monkeypatch.chdir(REPO)
    spec = load_spec(copy_)
    assert spec.source.path == str((tmp_path / "data" / "landing" / "page_views").resolve())
    assert spec.lake == str((tmp_path / "data" / "lake").resolve())


def test_load_spec_overrides_paths(tmp_path: Path) -> None:
    spec = load_spec(SAMPLE, lake=str(tmp_path / "lake"), source_path=str(tmp_path / "landing"))
    assert spec.lake == str((tmp_path / "lake").resolve())
    assert spec.source.path == str((tmp_path / "landing").resolve())
    # everything else is untouched
    assert spec.aggregates == load_spec(SAMPLE).aggregates


def test_load_spec_override_of_one_path_keeps_the_other(tmp_path: Path) -> None:
    spec = load_spec(SAMPLE, lake=str(tmp_path / "lake"))
    assert spec.lake == str((tmp_path / "lake").resolve())
    assert spec.source.path == load_spec(SAMPLE).source.path


def test_parse_spec_resolves_relative_paths_against_base_dir(tmp_path: Path) -> None:
    spec = parse(raw_spec(), tmp_path)
    assert spec.source.path == str((tmp_path / "landing" / "page_views").resolve())
    assert spec.lake == str((tmp_path / "lake").resolve())
    assert spec.origin == "t.yaml"


def test_absolute_paths_are_kept(tmp_path: Path) -> None:
    src, lake = tmp_path / "abs" / "src", tmp_path / "abs" / "lake"

    def absolute(raw: dict[str, Any]) -> None:
        raw["source"]["path"] = str(src)
        raw["lake"] = str(lake)

    spec = parse_spec(raw_spec(absolute), origin="t.yaml", base_dir=tmp_path / "elsewhere")
    assert spec.source.path == str(src.resolve())
    assert spec.lake == str(lake.resolve())


def test_uri_paths_are_kept_verbatim(tmp_path: Path) -> None:
    def uris(raw: dict[str, Any]) -> None:
        raw["source"]["path"] = "s3://bucket/landing"
        raw["lake"] = "s3://bucket/lake/"

    spec = parse(raw_spec(uris), tmp_path)
    assert spec.source.path == "s3://bucket/landing"
    assert spec.lake == "s3://bucket/lake/"
    assert PipelineTables(spec.lake, spec.name).aggregates == "s3://bucket/lake/page_views/aggregates"


def test_the_base_spec_is_valid(tmp_path: Path) -> None:
    spec = parse(raw_spec(), tmp_path)
    assert spec.name == "page_views"
    assert [a.fn for a in spec.aggregates] == ["count", "sum"]


def test_hopping_window(tmp_path: Path) -> None:
    spec = parse(raw_spec(lambda r: r["window"].update(slide="15 minutes")), tmp_path)
    assert spec.window == Hopping(Duration(3600), Duration(900))


def test_cumulative_window(tmp_path: Path) -> None:
    spec = parse(raw_spec(lambda r: r.update(window={"size": "1 day", "step": "1 hour"})), tmp_path)
    assert spec.window == Cumulative(Duration(86_400), Duration(3600))
    assert str(spec.window) == "1 day cumulating every 1 hour" and spec.key_columns[-2:] == ("window_start", "window_end")
    same = parse(raw_spec(lambda r: r.update(window={"size": "1 hour", "step": "1 hour"})), tmp_path)
    assert same.window == Tumbling(Duration(3600))  # a step of the whole size is a tumbling window


def test_session_window(tmp_path: Path) -> None:
    spec = parse(raw_spec(lambda r: r.update(window={"gap": "30 minutes"})), tmp_path)
    assert spec.window == Sessions(Duration(1800))


# --- rejections --------------------------------------------------------------------------------

REJECTIONS: list[Any] = [
    pytest.param(lambda r: r.update(windw=r.pop("window")),
                 "windw", "unknown field; allowed fields are name, source, group_by, window", id="unknown-top-field"),
    pytest.param(lambda r: r.pop("lake"), "lake", "is required", id="missing-lake"),
    pytest.param(lambda r: r.update(name="Page-Views"),
                 "name", "bad name 'Page-Views'; use lower-case letters, digits and '_'", id="bad-name"),
    pytest.param(lambda r: r["source"].update(format="avro"),
                 "source.format", "unknown format 'avro'; use one of parquet, json, csv", id="unknown-format"),
    pytest.param(lambda r: r["source"]["schema"].update(weight="decimal"),
                 "source.schema.weight", "unknown type 'decimal'; use one of string, int", id="unknown-type"),
    pytest.param(lambda r: r["source"].update(event_time="ts"),
                 "source.event_time", "column 'ts' is not in source.schema; add it as ts: timestamp",
                 id="event-time-not-in-schema"),
    pytest.param(lambda r: r["source"]["schema"].update(event_time="string"),
                 "source.event_time", "column 'event_time' has type string; declare it as timestamp",
                 id="event-time-not-timestamp"),
    pytest.param(lambda r: r.update(group_by=["page", "region"]),
                 "group_by", "column 'region' is not in source.schema; add it or remove it from group_by",
                 id="group-by-missing-column"),
    pytest.param(lambda r: r.update(group_by=["page", "page"]),
                 "group_by", "duplicate columns in ['page', 'page']; list each column once", id="group-by-duplicate"),
    pytest.param(lambda r: r.update(window={"size": "1 fortnight"}),
                 "window", "bad duration '1 fortnight'; write a positive whole number and a unit",
                 id="duration-unknown-unit"),
    pytest.param(lambda r: r.update(window={"size": "0 s"}),
                 "window", "bad duration '0 s'; write a positive whole number and a unit", id="duration-zero"),
    pytest.param(lambda r: r.update(window={"size": "-5 minutes"}),
                 "window", "bad duration '-5 minutes'; write a positive whole number and a unit",
                 id="duration-negative"),
    pytest.param(lambda r: r.update(window={"gap": "30 minutes", "size": "1 hour"}),
                 "window", "a session window has a gap and no size or slide", id="session-with-size"),
    pytest.param(lambda r: r.update(window={"gap": "soon"}),
                 "window.gap", "bad duration 'soon'", id="session-bad-gap"),
    pytest.param(lambda r: r.update(window={"slide": "1 hour"}),
                 "window.size", "is required: declare {size: 1 hour} (tumbling)", id="window-without-size"),
    pytest.param(lambda r: (r.update(window={"gap": "30 minutes"}), r["source"]["schema"].update(op="string"),
                            r["source"].update(op_column="op")),
                 "window.gap", "session windows need an append-only source", id="session-with-retractions"),
    pytest.param(lambda r: r.update(window={"gap": "30 minutes"}, rollups=[{"name": "daily", "grain": "1 day"}]),
                 "rollups", "rollups merge whole tumbling windows, and sessions have no fixed bucket", id="session-rollups"),
    pytest.param(lambda r: r.update(window={"size": "1 hour", "slide": "2 hours"}),
                 "window.slide", "slide 2 hours is longer than size 1 hour; use a slide <= size",
                 id="slide-longer-than-size"),
    pytest.param(lambda r: r.update(window={"size": "1 day", "step": "7 hours"}), "window.step",
                 "step 7 hours does not divide size 1 day; use a step that divides it", id="step-not-dividing-size"),
    pytest.param(lambda r: r.update(window={"size": "1 day", "step": "1 hour", "slide": "1 hour"}), "window",
                 "'slide' and 'step' are mutually exclusive; define only one", id="slide-and-step"),
    pytest.param(lambda r: r.update(window={"size": "1 day", "step": "1 hour"},
                                    rollups=[{"name": "hourly", "grain": "1 hour"}]),
                 "rollups[0].grain", "grain 1 hour is not a whole number of 1 day windows", id="cumulative-hourly-rollup"),
    pytest.param(add_agg(name="med", fn="medain", column="duration_ms"),
                 "aggregates[2].fn", "unknown function 'medain'; use one of count, sum", id="unknown-fn"),
    pytest.param(add_agg(name="s", fn="sum", column="page"),
                 "aggregates[2].column", "sum needs a numeric column; 'page' is string", id="sum-of-string"),
    pytest.param(add_agg(name="c", fn="count", columns=["page", "user_id"]),
                 "aggregates[2].columns", "count takes at most one column, got ['page', 'user_id']",
                 id="count-two-columns"),
    pytest.param(add_agg(name="s", fn="sum"),
                 "aggregates[2].column", "sum needs exactly one column; add column: <name>", id="sum-no-column"),
    pytest.param(add_agg(name="views", fn="count"),
                 "aggregates[2].name", "name 'views' clashes with a column or another aggregate; choose a unique name",
                 id="duplicate-aggregate-name"),
    pytest.param(add_agg(name="page", fn="count"),
                 "aggregates[2].name", "name 'page' clashes with a column or another aggregate", id="name-is-source-column"),
    pytest.param(add_agg(name="n_rows", fn="count"),
                 "aggregates[2].name", "name 'n_rows' clashes with a column or another aggregate", id="name-reserved-n_rows"),
    pytest.param(add_agg(name="window_start", fn="count"),
                 "aggregates[2].name", "name 'window_start' clashes with a column or another aggregate",
                 id="name-reserved-window_start"),
    pytest.param(add_agg(name="a__b", fn="count"),
                 "aggregates[2].name", "bad name 'a__b'; use lower-case letters, digits and single '_'",
                 id="name-double-underscore"),
    pytest.param(add_agg(name="m", fn="max", column="duration_ms", columns=["duration_ms"]),
                 "aggregates[2]", "'column' and 'columns' are mutually exclusive; define only one",
                 id="column-and-columns"),
    pytest.param(add_agg(name="p", fn="approx_percentile", column="duration_ms"),
                 "aggregates[2].args.q", "bad quantile None; give args: {q: 0.95} with 0 <= q <= 1",
                 id="percentile-without-q"),
    pytest.param(add_agg(name="p", fn="approx_percentile", column="duration_ms", args={"q": 1.5}),
                 "aggregates[2].args.q", "bad quantile 1.5; give args: {q: 0.95} with 0 <= q <= 1",
                 id="percentile-q-out-of-range"),
    pytest.param(add_agg(name="u", fn="approx_count_distinct", column="user_id", args={"lg_k": 30}),
                 "aggregates[2].args.lg_k", "bad value 30; use a whole number from 4 to 21", id="lg-k-out-of-range"),
    pytest.param(add_agg(name="s", fn="sum", column="duration_ms", args={"precision": 3}),
                 "aggregates[2].args", "unknown argument 'precision' for sum; allowed: none", id="unknown-arg"),
    pytest.param(add_agg(name="x", fn="nope.mod:X", column="duration_ms"),
                 "aggregates[2].fn", "cannot import 'nope.mod'", id="udaf-cannot-import"),
    pytest.param(add_agg(name="x", fn="spark_jobs.spec:PipelineSpec", column="duration_ms"),
                 "aggregates[2].fn",
                 "'spark_jobs.spec:PipelineSpec' is not a subclass of spark_jobs.aggregates.AggregateFunction; subclass it",
                 id="udaf-not-a-subclass"),
    pytest.param(add_agg(name="w", fn="spark_jobs.aggregates.examples:WeightedAvg", columns=["duration_ms"]),
                 "aggregates[2].columns",
                 "spark_jobs.aggregates.examples:WeightedAvg takes 2 column(s), got ['duration_ms']",
                 id="udaf-wrong-column-count"),
]


@pytest.mark.parametrize(("mutate", "field", "fix"), REJECTIONS)
def test_rejection_names_field_and_fix(mutate: Callable[[dict[str, Any]], object], field: str, fix: str,
                                       tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=re.escape(f"{field}: {fix}")) as info:
        parse(raw_spec(mutate), tmp_path)
    err = info.value
    assert err.origin == "t.yaml"
    assert str(err).startswith("invalid pipeline spec t.yaml:\n")
    # one targeted mistake gives exactly one problem, and it is the expected one
    assert len(err.problems) == 1, err.problems
    assert err.problems[0].startswith(f"{field}: {fix}")


def test_several_problems_are_reported_in_one_error(tmp_path: Path) -> None:
    def many(raw: dict[str, Any]) -> None:
        raw["name"] = "Page-Views"
        raw["source"]["format"] = "avro"
        raw["group_by"] = ["page", "page"]
        raw["window"] = {"size": "1 fortnight"}
        raw["aggregates"].append({"name": "med", "fn": "medain", "column": "duration_ms"})
        raw.pop("lake")

    with pytest.raises(SpecError) as info:
        parse(raw_spec(many), tmp_path)
    problems = info.value.problems
    assert len(problems) == 6, problems
    fields = sorted(p.split(":", 1)[0] for p in problems)
    assert fields == sorted(["name", "source.format", "group_by", "window", "aggregates[2].fn", "lake"])
    for p in problems:
        assert f"  - {p}" in str(info.value)


# --- durations ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1 hour", 3600),
        ("90 s", 90),
        ("10 minutes", 600),
        ("2 days", 172800),
        ("30 seconds", 30),
        ("1 min", 60),
        ("5m", 300),
        ("3 h", 10800),
        ("  7 sec  ", 7),
        ("1 day", 86400),
    ],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == Duration(seconds)


@pytest.mark.parametrize("text", ["1 fortnight", "0 s", "-5 minutes", "1.5 hours", "hour", "", "3600", None, 3600])
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(ValueError, match=r"bad duration .*; write a positive whole number and a unit"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(3600, "1 hour"), (7200, "2 hours"), (60, "1 minute"), (600, "10 minutes"), (86400, "1 day"),
     (172800, "2 days"), (90, "90 seconds"), (1, "1 seconds")],
)
def test_duration_str(seconds: int, text: str) -> None:
    assert str(Duration(seconds)) == text


def test_duration_round_trips_through_its_text() -> None:
    for seconds in (1, 59, 60, 90, 3600, 5400, 86400, 90000):
        assert parse_duration(str(Duration(seconds))) == Duration(seconds)


def test_duration_spark_interval() -> None:
    assert Duration(3600).spark == "3600 seconds"


# --- the spec file -----------------------------------------------------------------------------


def test_spec_file_that_is_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: page_views\nsource: {path: [unclosed\n")
    with pytest.raises(SpecError, match=re.escape(str(path)) + r":\n  - not valid YAML") as info:
        load_spec(path)
    assert info.value.origin == str(path)
    assert re.search(r"not valid YAML at line \d+, column \d+: .+; fix the YAML syntax there", str(info.value))


def test_spec_file_that_does_not_exist(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(SpecError, match=re.escape(str(path)) + r":\n  - cannot read the spec file") as info:
        load_spec(path)
    assert "pass an existing YAML file" in str(info.value)
    assert info.value.origin == str(path)


def test_spec_file_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match=r"spec: expected a YAML mapping with name, source") as info:
        load_spec(path)
    assert info.value.origin == str(path)


def test_spec_error_exit_code() -> None:
    assert SpecError("x", ["a: b"]).exit_code == 2


# --- inputs that once printed a traceback --------------------------------------------------------------
@pytest.mark.parametrize(("mutate", "message"), [
    (lambda r: r["source"].update(event_time=["event_time"]), "source.event_time: expected a column name, got list"),
    (lambda r: r["source"].update(event_time={"a": 1}), "source.event_time: expected a column name, got dict"),
    (lambda r: r["aggregates"].append({"name": "p", "fn": "approx_percentile", "column": "duration_ms",
                                       "args": {"q": 0.5, 1: 2}}), "aggregates[2].args: argument names must be strings"),
    (lambda r: r["source"].update(schema={}), "source.schema: is empty"),
    (lambda r: r.update({"": 1}), "'': unknown field"),
])
def test_malformed_fields_are_named(tmp_path, mutate, message) -> None:
    with pytest.raises(SpecError) as info:
        parse(raw_spec(mutate), tmp_path)
    assert message in str(info.value)


@pytest.mark.parametrize(("source", "message"), [
    ("def broken(:\n", "has a syntax error at"),
    ("x = undefined_name\n", "raised NameError: name 'undefined_name' is not defined"),
    ("raise RuntimeError('no config')\n", "raised RuntimeError: no config"),
])
def test_a_user_aggregate_module_that_fails_to_import_is_named(tmp_path, monkeypatch, source, message) -> None:
    module = f"udaf_{abs(hash(source))}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError) as info:
        parse(raw_spec(add_agg(name="u", fn=f"{module}:Agg", columns=["duration_ms"])), tmp_path)
    assert "aggregates[2].fn: " in str(info.value) and message in str(info.value)


def test_an_empty_spec_file_says_so(tmp_path) -> None:
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    with pytest.raises(SpecError, match="spec: the file is empty"):
        load_spec(tmp_path / "empty.yaml")


def test_a_bad_window_still_checks_the_rollups(tmp_path) -> None:
    def mutate(r: dict[str, Any]) -> None:
        r["window"] = {"size": "soon"}
        r["rollups"] = [{"name": "Daily", "grain": "1 day", "by": ["nope"]}]

    with pytest.raises(SpecError) as info:
        parse(raw_spec(mutate), tmp_path)
    problems = info.value.problems
    assert problems[0].startswith("window: bad duration 'soon'")
    assert any(p.startswith("rollups[0].name: bad name 'Daily'") for p in problems)
    assert any(p.startswith("rollups[0].by: 'nope' is not a group key") for p in problems)
    assert not any("tumbling" in p for p in problems)


# --- source.on_bad_file ----------------------------------------------------------------------------


def test_on_bad_file_defaults_to_quarantine_and_takes_fail(tmp_path: Path) -> None:
    assert parse(raw_spec(), tmp_path).source.on_bad_file == "quarantine"
    spec = parse(raw_spec(lambda r: r["source"].__setitem__("on_bad_file", "fail")), tmp_path)
    assert spec.source.on_bad_file == "fail"


def test_an_unknown_on_bad_file_names_both_policies(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as info:
        parse(raw_spec(lambda r: r["source"].__setitem__("on_bad_file", "skip")), tmp_path)
    assert info.value.problems == ["source.on_bad_file: unknown policy 'skip'; use quarantine (record an unreadable "
                                   "landing file in dead_letter and go on) or fail (stop the job, naming the file)"]


def test_null_keys_defaults_to_group_and_an_unknown_one_names_both_policies(tmp_path: Path) -> None:
    assert parse(raw_spec(), tmp_path).source.null_keys == "group"
    with pytest.raises(SpecError) as info:
        parse(raw_spec(lambda r: r["source"].__setitem__("null_keys", "drop")), tmp_path)
    assert info.value.problems == ["source.null_keys: unknown policy 'drop'; use group (a NULL group key is a group "
                                   "of its own, as in SQL) or reject (the row goes to dead_letter)"]


def test_the_lake_records_on_bad_file_only_when_it_is_not_the_default(tmp_path: Path) -> None:
    """A lake recorded before the setting existed keeps its fingerprint; `fail` is a settings-only change."""
    from spark_jobs.lake.spec_record import normalise
    from spark_jobs.spec_plan import compare

    default = parse(raw_spec(), tmp_path)
    fail = parse(raw_spec(lambda r: r["source"].__setitem__("on_bad_file", "fail")), tmp_path)
    assert "on_bad_file" not in normalise(default)["source"]
    assert normalise(fail)["source"]["on_bad_file"] == "fail"
    [change] = compare(default, fail).changes
    assert (change.kind, change.field) == ("settings", "source.on_bad_file")
