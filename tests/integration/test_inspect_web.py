"""The lake view's FastAPI app in-process (no Airflow server): pages, JSON API, validation, confinement.

Mounted at ``/lake`` as the API server mounts it. Authentication is switched off except in
the tests of the unauthenticated path; the real Airflow login is tested in
``tests/e2e/test_lake_view.py``.
"""

from __future__ import annotations

import html
import json
import os
import re
import warnings
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from fastapi import FastAPI

with warnings.catch_warnings():  # "Using httpx with starlette.testclient is deprecated": not ours to fix
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from plugins.lake_view.app import create_app
from spark_jobs.__main__ import main
from spark_jobs.inspection.render import jsonable
from spark_jobs.inspection.specs import SPECS_ENV
from tests.helpers import direct_rollup
from tests.inspect_lake import PIPELINE, snapshot

pytestmark = pytest.mark.spark

AGG = f"{PIPELINE}.aggregates"


@pytest.fixture(scope="module", autouse=True)
def pipelines(inspect_spec):
    """``$SPARK_JOBS_PIPELINES`` is the folder of the test lake's spec (the rollup finds it there by name)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SPECS_ENV, str(Path(inspect_spec.origin).parent))
        yield Path(inspect_spec.origin).parent


def client(lake_root: str, *, authenticate: bool = False) -> TestClient:
    root = FastAPI()
    root.mount("/lake", create_app(lake_root=lake_root, authenticate=authenticate))
    return TestClient(root, follow_redirects=False)


@pytest.fixture(scope="module")
def web(inspect_lake):
    return client(inspect_lake)


def cli_json(capsys, *argv: str):
    assert main(["inspect", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- pages
def test_index_lists_the_tables_with_links(web):
    r = web.get("/lake/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    links = re.findall(r'class="table-link" href="([^"]+)">([^<]+)<', r.text)
    assert [name for _, name in links] == [f"{PIPELINE}.{t}" for t in ("partials", "aggregates", "changelog",
                                                                              "dead_letter", "runs", "specs")]
    assert links[1][0] == f"/lake/table/{AGG}"
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert "<script" not in r.text


def test_table_page_shows_versions_rows_and_history(web):
    r = web.get(f"/lake/table/{AGG}")
    assert r.status_code == 200
    assert re.findall(r'<option value="(\d+)"', r.text) == ["1", "0"]
    assert 'id="shown-version">version 1</b>' in r.text
    history = r.text.split('id="history"')[1].split("</table>")[0]
    assert history.count("<tr") == 3  # header + two versions
    assert f"txn {PIPELINE}.reduce=2" in history

    r = web.get(f"/lake/table/{AGG}", params={"version": 0, "where": "page = '/d'"})
    assert r.status_code == 200 and 'id="shown-version">version 0</b>' in r.text and 'id="rows">(no rows)' in r.text


def test_diff_and_chart_pages(web):
    r = web.get(f"/lake/table/{AGG}/diff", params={"from": 0, "to": 1})
    assert r.status_code == 200
    assert int(re.search(r'id="n-added">(\d+)<', r.text).group(1)) > 0
    assert int(re.search(r'id="n-changed">(\d+)<', r.text).group(1)) > 0
    r = web.get(f"/lake/table/{AGG}/chart", params={"metric": "views", "where": "page IN ('/b', '/c')"})
    assert r.status_code == 200
    assert r.text.count('<g class="series"') == 2 and "<polyline" in r.text
    assert web.get("/lake/runs", params={"pipeline": PIPELINE}).status_code == 200


# ----------------------------------------------------------------------------- rollup
def rollup_cells(text: str) -> list[dict[str, str]]:
    """The rollup page's grid, a dict of cell texts per row."""
    table = text.split('id="rollup-rows"')[1].split("</table>")[0]
    header = re.findall(r"<th>([^<]*)</th>", table)
    return [dict(zip(header, re.findall(r"<td[^>]*>([^<]*)</td>", row), strict=True))
            for row in table.split("<tr>")[2:]]


def test_the_table_page_links_the_rollup_of_aggregates_only(web):
    r = web.get(f"/lake/table/{AGG}")
    assert f'id="rollup-link" href="/lake/table/{AGG}/rollup?version=1"' in r.text
    assert 'id="rollup-link"' not in web.get(f"/lake/table/{PIPELINE}.partials").text


def test_the_history_link_opens_the_changelog_of_the_rows_shown_in_fold_order(web):
    r = web.get(f"/lake/table/{AGG}", params={"where": "page = '/d'"})
    link = html.unescape(re.search(r'id="changes-link"[^>]* href="([^"]+)"', r.text).group(1))
    assert link.startswith(f"/lake/table/{PIPELINE}.changelog?")
    query = parse_qs(urlsplit(link).query)
    assert query["where"] == ["page = '/d'"] and query["order_by"] == ["aggregates_version,seq"]
    history = web.get(link)
    assert history.status_code == 200 and 'id="rows-error"' not in history.text
    assert 'id="changes-link"' not in web.get(f"/lake/table/{PIPELINE}.partials").text


def test_the_rollup_page_opens_on_the_last_day_of_data(web, inspect_lake, inspect_spec):
    r = web.get(f"/lake/table/{AGG}/rollup")
    assert r.status_code == 200, r.text
    values = dict(re.findall(r'<input type="text" id="(\w+)" name="\w+" value="([^"]*)"', r.text))
    assert values == {"from": "2024-03-02 00:00", "to": "2024-03-03 00:00", "by": "page", "grain": "all",
                      "where": ""}
    expected = direct_rollup(inspect_lake, inspect_spec, "2024-03-02", "2024-03-03", ("page",))
    cells = rollup_cells(r.text)
    assert [c["page"] for c in cells] == expected["page"].to_pylist() == ["/b", "/c", "/d"]
    assert [int(c["views"]) for c in cells] == expected["views"].to_pylist()
    assert {(c["start"], c["end"]) for c in cells} == {("2024-03-02 00:00:00", "2024-03-03 00:00:00")}
    assert r.text.count('<g class="series"') == 3 and ">bucket start (UTC)<" in r.text
    assert 'id="rollup-caption">3 rows' in r.text
    r = web.get(f"/lake/table/{AGG}/rollup", params={"where": "page = '/nowhere'"})
    assert r.status_code == 200 and 'id="rollup-rows">(no rows)' in r.text and "no points to draw" in r.text
    assert web.get(f"/lake/api/table/{AGG}/rollup", params={"where": "page = '/nowhere'"}).json() == []


def test_the_rollup_page_draws_a_grain_and_a_chosen_metric(web, inspect_lake, inspect_spec):
    r = web.get(f"/lake/table/{AGG}/rollup", params={"from": "2024-03-01", "to": "2024-03-03", "by": "page",
                                                      "grain": "1 day", "metric": "total_ms", "where": "page != '/a'"})
    assert r.status_code == 200, r.text
    expected = direct_rollup(inspect_lake, inspect_spec, "2024-03-01", "2024-03-03", ("page",), 86_400, "page != '/a'")
    cells = rollup_cells(r.text)
    assert [(c["page"], c["start"], int(c["total_ms"])) for c in cells] == [
        (p, f"{t:%Y-%m-%d %H:%M:%S}", v) for p, t, v in
        zip(expected["page"].to_pylist(), expected["start"].to_pylist(), expected["total_ms"].to_pylist(), strict=True)]
    assert '<option value="total_ms" selected>' in r.text
    assert 'aria-label="total_ms by bucket start, views.aggregates version 1"' in r.text
    points = {g: len(re.findall("<circle", body)) for g, body in
              re.findall(r'<g class="series" data-label="([^"]+)">(.*?)</g>', r.text)}
    assert points == {"page=/b": 2, "page=/c": 2, "page=/d": 1}  # /d only landed on the second day


def test_the_rollup_api_answers_what_rollup_and_the_cli_answer(web, inspect_lake, inspect_spec, capsys):
    params = {"from": "2024-03-01", "to": "2024-03-03 00:00", "by": "page", "grain": "1 day"}
    api = web.get(f"/lake/api/table/{AGG}/rollup", params=params)
    assert api.status_code == 200, api.text
    expected = jsonable(direct_rollup(inspect_lake, inspect_spec, "2024-03-01", "2024-03-03", ("page",),
                                      86_400).to_pylist())
    assert api.json() == expected
    assert api.json() == cli_json(capsys, "rollup", AGG, "--pipeline", inspect_spec.origin, "--from", "2024-03-01",
                                  "--to", "2024-03-03", "--by", "page", "--grain", "1 day")
    # by='' merges every key; no from/to is the last day of data, as on the page
    merged = web.get(f"/lake/api/table/{AGG}/rollup", params={"by": ""}).json()
    assert merged == jsonable(direct_rollup(inspect_lake, inspect_spec, "2024-03-02", "2024-03-03", ()).to_pylist())
    assert len(merged) == 1 and "page" not in merged[0]
    # version 0 still has page /a on the second day
    v0 = web.get(f"/lake/api/table/{AGG}/rollup", params={"version": 0}).json()
    assert {row["page"] for row in v0} == {"/a", "/b", "/c"}


def test_rollup_errors_on_the_page_keep_the_form(web):
    r = web.get(f"/lake/table/{AGG}/rollup", params={"from": "2024-03-02 00:30", "to": "2024-03-03"})
    assert r.status_code == 400
    assert 'id="rollup-error">--from 2024-03-02 00:30:00 cuts a 1 hour window' in r.text
    assert 'id="from" name="from" value="2024-03-02 00:30"' in r.text and 'id="rollup-rows"' not in r.text
    r = web.get(f"/lake/table/{AGG}/rollup", params={"metric": "page"})
    assert r.status_code == 400 and "metric &#39;page&#39; is not a numeric aggregate of views" in r.text
    r = web.get(f"/lake/table/{PIPELINE}.runs/rollup")
    assert r.status_code == 400 and 'id="error">a rollup merges a pipeline&#39;s aggregates table' in r.text


def test_rollup_reads_the_spec_the_lake_records_not_the_specs_folder(web, tmp_path, monkeypatch):
    (tmp_path / "other.yaml").write_text("name: other\n")
    monkeypatch.setenv(SPECS_ENV, str(tmp_path))
    r = web.get(f"/lake/api/table/{AGG}/rollup")
    assert r.status_code == 200, r.text
    assert r.json() == web.get(f"/lake/api/table/{AGG}/rollup").json() and r.json()


# ----------------------------------------------------------------------------- JSON API = the CLI's views
def test_the_json_api_answers_what_the_cli_answers(web, inspect_lake, capsys):
    assert web.get(f"/lake/api/table/{AGG}/history").json() == cli_json(capsys, "history", AGG, "--lake", inspect_lake)
    rows = web.get(f"/lake/api/table/{AGG}/rows", params={"version": 0, "where": "views >= 3", "limit": 500}).json()
    assert rows == cli_json(capsys, "show", AGG, "--lake", inspect_lake, "--version", "0", "--where", "views >= 3",
                            "--limit", "500")
    assert web.get(f"/lake/api/table/{AGG}/diff", params={"from": 0, "limit": 500}).json() == cli_json(
        capsys, "diff", AGG, "--lake", inspect_lake, "--from", "0", "--limit", "500")
    assert web.get(f"/lake/api/table/{AGG}/schema").json() == cli_json(capsys, "schema", AGG, "--lake", inspect_lake)
    assert web.get(f"/lake/api/runs?pipeline={PIPELINE}").json() == cli_json(capsys, "runs", PIPELINE, "--lake",
                                                                              inspect_lake)
    tables = web.get("/lake/api/tables").json()
    assert [t["table"] for t in tables] == [t["table"] for t in cli_json(capsys, "tables", "--lake", inspect_lake)]
    assert all("path" not in t for t in tables)  # the server's file layout is not shown
    series = web.get(f"/lake/api/table/{AGG}/series", params={"metric": "views"}).json()
    assert {ln["label"] for ln in series["lines"]} == {"page=/b", "page=/c", "page=/d", "page=/a"}


# ----------------------------------------------------------------------------- bad input
BAD = [
    (f"/lake/api/table/{PIPELINE}.nope/rows", 404, "unknown table 'nope'"),
    ("/lake/api/table/nope.aggregates/rows", 404, "no Delta table nope.aggregates"),
    (f"/lake/api/table/{AGG}/rows?version=7", 400, "version 7 of views.aggregates does not exist; its versions are 0..1"),
    (f"/lake/api/table/{AGG}/rows?version=-1", 400, "version: Input should be greater than or equal to 0"),
    (f"/lake/api/table/{AGG}/rows?version=abc", 400, "version: Input should be a valid integer"),
    (f"/lake/api/table/{AGG}/rows?limit=100000", 400, "limit: Input should be less than or equal to 500"),
    (f"/lake/api/table/{AGG}/rows?where=1%3D1%3B%20DROP%20TABLE%20x", 400, "unexpected character ';'"),
    (f"/lake/api/table/{AGG}/rows?where=page%20%3D%20%27x%27%20OR%201%3D1", 400,
     "bad filter at position 15: expected a column name, found the number 1"),
    (f"/lake/api/table/{AGG}/rows?columns=page;drop", 400, "columns: String should match pattern"),
    (f"/lake/api/table/{AGG}/rows?columns=page,nope", 400, "unknown columns 'nope'"),
    (f"/lake/api/table/{AGG}/rows?order_by=views%20desc", 400, "order_by: String should match pattern"),
    (f"/lake/api/table/{AGG}/rows?path=/etc", 400, "unknown query parameter 'path'"),
    (f"/lake/api/table/{AGG}/rows?version=0&version=1", 400, "query parameter 'version' is given more than once"),
    (f"/lake/api/table/{AGG}/rows?as_of=yesterday", 400, "bad time 'yesterday'"),
    (f"/lake/api/table/{AGG}/diff", 400, "from: Field required"),
    (f"/lake/api/table/{AGG}/diff?from=0&to=9", 400, "version 9 of views.aggregates does not exist"),
    (f"/lake/api/table/{AGG}/series?metric=page", 400, "metric 'page' is string, not a number"),
    (f"/lake/api/table/{AGG}/series?metric=x%27)", 400, "metric: String should match pattern"),
    ("/lake/api/table/..%2F..%2Fetc/rows", 404, "Not Found"),
    ("/lake/api/table/views.aggregates%2F..%2F..%2Fx/rows", 404, "Not Found"),
    ("/lake/api/table/VIEWS.aggregates/rows", 400, "name: String should match pattern"),
    ("/lake/api/table/views..aggregates/rows", 400, "name: String should match pattern"),
    ("/lake/api/runs?pipeline=..%2Fetc", 400, "pipeline: String should match pattern"),
    (f"/lake/api/table/{AGG}/rollup?from=2024-03-02%2000:30&to=2024-03-03", 400,
     "--from 2024-03-02 00:30:00 cuts a 1 hour window; use a window boundary such as 2024-03-02 00:00:00 or "
     "2024-03-02 01:00:00"),
    (f"/lake/api/table/{AGG}/rollup?from=yesterday", 400, "bad time 'yesterday'; use 'YYYY-MM-DD'"),
    (f"/lake/api/table/{AGG}/rollup?from=2024-03-02&to=2024-03-01", 400,
     "--to 2024-03-01 00:00:00 is not after --from 2024-03-02 00:00:00"),
    (f"/lake/api/table/{AGG}/rollup?by=country", 400,
     "unknown key 'country' in --by; views is grouped by page (drop a key to merge across it)"),
    (f"/lake/api/table/{AGG}/rollup?by=page,,page", 400, "bad by 'page,,page'; use comma-separated group keys"),
    (f"/lake/api/table/{AGG}/rollup?by=page;x", 400, "by: String should match pattern"),
    (f"/lake/api/table/{AGG}/rollup?grain=fortnight", 400,
     "bad grain 'fortnight'; use all, or a duration such as '1 hour', '1 day', '1 week'"),
    (f"/lake/api/table/{AGG}/rollup?grain=90%20minutes", 400,
     "grain of 5400 s is not a whole number of 1 hour windows"),
    (f"/lake/api/table/{AGG}/rollup?where=views%20%3E%201", 400, "unknown column 'views'"),
    (f"/lake/api/table/{PIPELINE}.partials/rollup", 400,
     "a rollup merges a pipeline's aggregates table, not its partials; open views.aggregates"),
    (f"/lake/api/table/{AGG}/rollup?metric=views", 400, "unknown query parameter 'metric'"),
    ("/lake/api/table/nope.aggregates/rollup", 404, "no Delta table nope.aggregates"),
]


@pytest.mark.parametrize(("url", "status", "message"), BAD, ids=[b[0].split("/lake")[1] for b in BAD])
def test_bad_requests_get_a_clear_error_and_change_nothing(web, inspect_lake, url, status, message):
    before = snapshot(inspect_lake)
    r = web.get(url)
    assert r.status_code == status, r.text
    body = r.json()
    assert message in (body.get("error") or body.get("detail")), body
    assert snapshot(inspect_lake) == before


def test_bad_page_requests_render_an_error_page(web):
    r = web.get(f"/lake/table/{AGG}", params={"where": "views > 1; DROP TABLE x"})
    assert r.status_code == 400
    assert 'id="rows-error"' in r.text and "unexpected character &#39;;&#39;" in r.text
    r = web.get(f"/lake/table/{AGG}", params={"version": 5})
    assert r.status_code == 400 and "version 5 of views.aggregates does not exist" in r.text


def test_values_echoed_into_the_page_are_escaped(web):
    evil = "page = '<script>alert(1)</script>'"
    r = web.get(f"/lake/table/{AGG}", params={"where": evil})
    assert r.status_code == 200 and "<script>" not in r.text and "&lt;script&gt;" in r.text


def test_the_view_is_read_only(web):
    assert web.post("/lake/api/tables").status_code == 405
    assert web.delete(f"/lake/api/table/{AGG}/rows").status_code == 405


def test_unauthenticated_requests_are_refused(inspect_lake):
    web = client(inspect_lake, authenticate=True)
    r = web.get(f"/lake/table/{AGG}")
    assert r.status_code == 302 and r.headers["location"].startswith("/auth/login?next=")
    r = web.get("/lake/api/tables")
    assert r.status_code == 401 and "not authenticated" in r.json()["error"]
    # authentication is checked before anything else: no hint about tables or parameters
    r = web.get("/lake/api/table/nope.aggregates/rows?bogus=1")
    assert r.status_code == 401


def test_symlinks_out_of_the_lake_are_not_followed(tmp_path):
    root = tmp_path / "lake"
    write_deltalake(str(root / "p1" / "aggregates"), pa.table({"page": ["/a"], "views": [1]}))
    outside = tmp_path / "secret"
    write_deltalake(str(outside / "aggregates"), pa.table({"page": ["/secret"], "views": [2]}))
    os.symlink(outside, root / "leak")
    web = client(str(root))
    assert [t["table"] for t in web.get("/lake/api/tables").json()] == ["p1.aggregates"]
    r = web.get("/lake/api/table/leak.aggregates/rows")
    assert r.status_code == 400 and "resolves outside the lake root" in r.json()["error"]


def test_a_missing_lake_is_reported(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARK_JOBS_LAKE", raising=False)
    r = client(str(tmp_path / "nowhere")).get("/lake/api/tables")
    assert r.status_code == 404 and "lake root" in r.json()["error"] and "does not exist" in r.json()["error"]
