"""Finding a pipeline's spec by name (the web view's rollup), and the rollup form's defaults: no Spark, no lake."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pyarrow as pa
import pytest

from plugins.lake_view.rollup_view import RollupForm, default_range
from spark_jobs.errors import InspectError
from spark_jobs.inspection.rollup import parse_by
from spark_jobs.inspection.specs import SPECS_ENV, find_spec, specs_folder
from tests.builders import FAST_AGGREGATES, make_spec

UTC = dt.UTC


def write_specs(folder: Path) -> None:
    make_spec(folder, name="clicks", aggregates=FAST_AGGREGATES, window={"size": "1 hour"})
    (folder / "views.yml").write_text((folder / "clicks.yaml").read_text().replace("name: clicks", "name: views"))
    (folder / "broken.yaml").write_text("name: [unclosed\n")
    (folder / "bad.yaml").write_text("name: views\nsource: {}\n")  # named views, but invalid
    (folder / "notes.txt").write_text("name: views\n")  # not a spec file


def test_finds_the_spec_by_name_among_yaml_and_yml(tmp_path):
    write_specs(tmp_path)
    assert find_spec("clicks", tmp_path).name == "clicks"
    spec = find_spec("views", tmp_path)  # bad.yaml is named views too, but invalid: skipped
    assert spec.name == "views" and spec.origin == str(tmp_path / "views.yml")
    assert spec.window.tile is not None and spec.window.tile.seconds == 3600


def test_no_match_names_the_folder_the_specs_and_the_skipped_files(tmp_path):
    write_specs(tmp_path)
    message = (f"no pipeline spec named 'orders' in {tmp_path} (specs there: clicks, views; "
               "skipped: broken.yaml (not valid YAML)); set $SPARK_JOBS_PIPELINES to the folder of the pipeline "
               "specs (default: the repo's pipelines/)")
    with pytest.raises(InspectError, match=re.escape(message)):
        find_spec("orders", tmp_path)
    (tmp_path / "views.yml").unlink()
    with pytest.raises(InspectError, match=r"no pipeline spec named 'views' .* skipped: bad\.yaml \(invalid: group_by: is required and \d+ more "
                                          r"problems\), broken\.yaml"):
        find_spec("views", tmp_path)


def test_two_specs_of_one_name_and_a_missing_folder_are_errors(tmp_path):
    make_spec(tmp_path, name="clicks", aggregates=FAST_AGGREGATES)
    (tmp_path / "copy.yml").write_text((tmp_path / "clicks.yaml").read_text())
    with pytest.raises(InspectError, match=r"2 specs in .* are named 'clicks': clicks\.yaml, copy\.yml; keep one"):
        find_spec("clicks", tmp_path)
    with pytest.raises(InspectError, match=r"no pipeline specs folder .*/nowhere; set \$SPARK_JOBS_PIPELINES"):
        find_spec("clicks", tmp_path / "nowhere")


def test_the_folder_comes_from_the_environment_else_the_repo(tmp_path, monkeypatch):
    monkeypatch.delenv(SPECS_ENV, raising=False)
    assert specs_folder() == Path(__file__).resolve().parents[2] / "pipelines"
    assert find_spec("page_views").name == "page_views"  # the sample spec the repo ships
    make_spec(tmp_path, name="clicks", aggregates=FAST_AGGREGATES)
    monkeypatch.setenv(SPECS_ENV, str(tmp_path))
    assert specs_folder() == tmp_path and find_spec("clicks").name == "clicks"


# ----------------------------------------------------------------------------- the rollup form
class FakeSnapshot:
    """The two calls the form's defaults make on a snapshot."""

    def __init__(self, starts: list[dt.datetime]) -> None:
        self.rows = pa.table({"window_start": pa.array(starts, pa.timestamp("us", tz="UTC"))})

    def schema(self) -> pa.Schema:
        return self.rows.schema

    def read(self, columns: list[str]) -> pa.Table:
        return self.rows.select(columns)


@pytest.mark.parametrize(("size", "last", "expected"), [
    ("1 hour", dt.datetime(2024, 3, 2, 23, tzinfo=UTC),
     (dt.datetime(2024, 3, 2, tzinfo=UTC), dt.datetime(2024, 3, 3, tzinfo=UTC))),
    ("1 day", dt.datetime(2024, 3, 2, tzinfo=UTC),
     (dt.datetime(2024, 3, 2, tzinfo=UTC), dt.datetime(2024, 3, 3, tzinfo=UTC))),
    # 7 hours do not divide a day: the last three windows (whole windows, from the epoch as Spark counts them)
    ("7 hours", dt.datetime(2024, 3, 4, 9, tzinfo=UTC),
     (dt.datetime(2024, 3, 3, 19, tzinfo=UTC), dt.datetime(2024, 3, 4, 16, tzinfo=UTC))),
    ("1 week", dt.datetime(2024, 3, 7, tzinfo=UTC),  # Spark's week windows start on Thursdays, as the epoch did
     (dt.datetime(2024, 3, 7, tzinfo=UTC), dt.datetime(2024, 3, 14, tzinfo=UTC))),
])
def test_the_default_range_is_the_last_day_of_whole_windows(tmp_path, size, last, expected):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES, window={"size": size})
    snap = FakeSnapshot([last - dt.timedelta(days=3), last])
    assert default_range(snap, spec) == expected  # type: ignore[arg-type]


def test_the_form_fills_in_defaults_and_keeps_the_users_text(tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES, window={"size": "1 hour"}, group_by=["page", "country"])
    snap = FakeSnapshot([dt.datetime(2024, 3, 2, 5, tzinfo=UTC)])
    form = RollupForm.with_defaults(snap, spec, start=None, end=None, by=None, grain=None, where=None)  # type: ignore[arg-type]
    assert form == RollupForm("2024-03-02 00:00", "2024-03-03 00:00", "page, country", "all", None)
    assert form.request(spec).by == ("page", "country") and form.request(spec).grain_s is None
    form = RollupForm.with_defaults(snap, spec, start="2024-03-01", end=None, by="", grain="1 day",  # type: ignore[arg-type]
                                    where="page = '/a'")
    assert form == RollupForm("2024-03-01", "2024-03-03 00:00", "", "1 day", "page = '/a'")
    request = form.request(spec)
    assert (request.start, request.by, request.grain_s) == (dt.datetime(2024, 3, 1, tzinfo=UTC), (), 86_400)


def test_by_text(tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES, group_by=["page", "country"])
    assert parse_by(None, spec) == ("page", "country")
    assert parse_by("  ", spec) == ()
    assert parse_by(" country ,page", spec) == ("country", "page")
    with pytest.raises(InspectError, match=r"bad by 'page,'; use comma-separated group keys, e\.g\. page,country"):
        parse_by("page,", spec)
