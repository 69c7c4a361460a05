"""The lake view's FastAPI app in-process (no Airflow server): pages, JSON API, validation, confinement.

Mounted at ``/lake`` as the API server mounts it. Authentication is switched off except in
the tests of the unauthenticated path; the real Airflow login is tested in
``tests/e2e/test_lake_view.py``.
"""

from __future__ import annotations

import json
import os
import re
import warnings

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from fastapi import FastAPI

with warnings.catch_warnings():  # "Using httpx with starlette.testclient is deprecated": not ours to fix
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from plugins.lake_view.app import create_app
from spark_jobs.__main__ import main
from tests.inspect_lake import PIPELINE, shared_lake, snapshot

pytestmark = pytest.mark.spark

AGG = f"{PIPELINE}.aggregates"


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    return shared_lake(spark, tmp_path_factory).lake


def client(lake_root: str, *, authenticate: bool = False) -> TestClient:
    root = FastAPI()
    root.mount("/lake", create_app(lake_root=lake_root, authenticate=authenticate))
    return TestClient(root, follow_redirects=False)


@pytest.fixture(scope="module")
def web(lake):
    return client(lake)


def cli_json(capsys, *argv: str):
    assert main(["inspect", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- pages
def test_index_lists_the_tables_with_links(web):
    r = web.get("/lake/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    links = re.findall(r'class="table-link" href="([^"]+)">([^<]+)<', r.text)
    assert [name for _, name in links] == [f"{PIPELINE}.{t}" for t in ("partials", "aggregates", "dead_letter", "runs")]
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


# ----------------------------------------------------------------------------- JSON API = the CLI's views
def test_the_json_api_answers_what_the_cli_answers(web, lake, capsys):
    assert web.get(f"/lake/api/table/{AGG}/history").json() == cli_json(capsys, "history", AGG, "--lake", lake)
    rows = web.get(f"/lake/api/table/{AGG}/rows", params={"version": 0, "where": "views >= 3", "limit": 500}).json()
    assert rows == cli_json(capsys, "show", AGG, "--lake", lake, "--version", "0", "--where", "views >= 3",
                            "--limit", "500")
    assert web.get(f"/lake/api/table/{AGG}/diff", params={"from": 0, "limit": 500}).json() == cli_json(
        capsys, "diff", AGG, "--lake", lake, "--from", "0", "--limit", "500")
    assert web.get(f"/lake/api/table/{AGG}/schema").json() == cli_json(capsys, "schema", AGG, "--lake", lake)
    assert web.get(f"/lake/api/runs?pipeline={PIPELINE}").json() == cli_json(capsys, "runs", PIPELINE, "--lake", lake)
    tables = web.get("/lake/api/tables").json()
    assert [t["table"] for t in tables] == [t["table"] for t in cli_json(capsys, "tables", "--lake", lake)]
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
]


@pytest.mark.parametrize(("url", "status", "message"), BAD, ids=[b[0].split("/lake")[1] for b in BAD])
def test_bad_requests_get_a_clear_error_and_change_nothing(web, lake, url, status, message):
    before = snapshot(lake)
    r = web.get(url)
    assert r.status_code == status, r.text
    body = r.json()
    assert message in (body.get("error") or body.get("detail")), body
    assert snapshot(lake) == before


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


def test_unauthenticated_requests_are_refused(lake):
    web = client(lake, authenticate=True)
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
