"""The lake view in a real browser against a real Airflow 3 API server.

A tiny lake is built by the real jobs (``tests/inspect_lake.py``); ``airflow api-server``
starts with this repo's ``plugins/`` folder, the simple auth manager and a known user; headless
Chromium (Debian's ``chromium`` + ``chromedriver``, driven by selenium) logs in through
Airflow's login page and uses the page: tables, history, switching versions, filters, diff,
runs, the chart, a rollup with its chart, errors, and the page embedded in the Airflow UI. Screenshots are kept under
``test-artifacts/lake_view/``.

Without Chromium the browser tests skip, saying how to install it, unless
``SPARK_JOBS_REQUIRE_BROWSER=1`` (set by ``.ci/run``), in which case they fail.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.inspection.render import cell
from tests.airflow.harness import AirflowHome, airflow_env, wait_healthy
from tests.helpers import ROOT, direct_rollup, free_port
from tests.inspect_lake import PIPELINE, snapshot

pytestmark = pytest.mark.slow

ARTIFACTS = ROOT / "test-artifacts" / "lake_view"
AGG = f"{PIPELINE}.aggregates"
TABLES = [f"{PIPELINE}.{t}" for t in ("partials", "aggregates", "changelog", "dead_letter", "runs", "specs")]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


# ----------------------------------------------------------------------------- Airflow API server
def http(url: str, *, token: str | None = None, method: str = "GET", body: dict | None = None,
         cookie: str | None = None) -> tuple[int, dict[str, str], str]:
    """(status, headers, text) without following redirects."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if cookie:
        headers["Cookie"] = cookie
    data = json.dumps(body).encode() if body is not None else None

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=headers, method=method), timeout=60) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


@pytest.fixture(scope="module")
def airflow(inspect_lake, inspect_spec, tmp_path_factory):
    """A real ``airflow api-server`` with the repo's plugins, SPARK_JOBS_LAKE pointing at the test lake and
    SPARK_JOBS_PIPELINES at the folder of its spec (the rollup page finds the spec there)."""
    home = tmp_path_factory.mktemp("airflow_home")
    (home / "dags").mkdir()
    password = secrets.token_urlsafe(12)
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    port = free_port()
    pipelines = Path(inspect_spec.origin).parent
    env = airflow_env(home, dags=home / "dags", port=port, **{
        "AIRFLOW__CORE__LAZY_LOAD_PLUGINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "SPARK_JOBS_LAKE": inspect_lake,
        "SPARK_JOBS_PIPELINES": str(pipelines),
    })
    af = AirflowHome(home, pipelines, env, port)
    af.run("db", "migrate", timeout=300)
    with af.background(["api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]) as procs:
        wait_healthy(port, timeout=180, log=lambda: af.log("api-server"), proc=procs[0])
        yield {"base": f"http://127.0.0.1:{port}", "user": "admin", "password": password, "home": home}


def token(airflow: dict[str, Any]) -> str:
    status, _, text = http(f"{airflow['base']}/auth/token", method="POST",
                           body={"username": airflow["user"], "password": airflow["password"]})
    assert status == 201, text
    return json.loads(text)["access_token"]


# ----------------------------------------------------------------------------- no browser needed
def test_the_plugin_is_registered_with_a_menu_entry(airflow):
    status, _, text = http(f"{airflow['base']}/api/v2/plugins", token=token(airflow))
    assert status == 200
    plugin = next(p for p in json.loads(text)["plugins"] if p["name"] == "lake_view")
    assert plugin["fastapi_apps"][0]["url_prefix"] == "/lake"
    assert plugin["external_views"][0]["name"] == "Lake" and plugin["external_views"][0]["href"] == "lake/"


def test_unauthenticated_requests_are_refused(airflow, inspect_lake):
    base = airflow["base"]
    before = snapshot(inspect_lake)
    status, headers, _ = http(f"{base}/lake/table/{AGG}")
    assert status == 302
    assert headers["location"].removeprefix(base).startswith("/auth/login?next=")
    status, _, text = http(f"{base}/lake/api/tables")
    assert status == 401 and "not authenticated" in json.loads(text)["error"]
    status, _, text = http(f"{base}/lake/api/table/{AGG}/rows", token="not-a-jwt")
    assert status == 401 and "Invalid JWT token" in json.loads(text)["error"]
    status, _, _ = http(f"{base}/lake/api/tables", cookie="_token=forged.jwt.value")
    assert status == 401
    # a token signed with another secret is refused too
    forged = "eyJhbGciOiJIUzUxMiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJhZG1pbiJ9.c2lnbmF0dXJl"
    assert http(f"{base}/lake/api/tables", token=forged)[0] == 401
    assert snapshot(inspect_lake) == before


def test_a_token_from_airflow_opens_the_json_api(airflow):
    t = token(airflow)
    status, _, text = http(f"{airflow['base']}/lake/api/tables", token=t)
    assert status == 200
    assert [r["table"] for r in json.loads(text)] == [f"{PIPELINE}.{x}" for x in ("partials", "aggregates",
                                                                                    "changelog", "dead_letter", "runs", "specs")]
    status, _, text = http(f"{airflow['base']}/lake/api/table/{AGG}/rows?where=1%3D1%3B%20DROP", token=t)
    assert status == 400 and "unexpected character ';'" in json.loads(text)["error"]
    status, _, text = http(f"{airflow['base']}/lake/api/table/..%2F..%2Fetc%2Fpasswd/rows", token=t)
    assert status == 404


# ----------------------------------------------------------------------------- the browser
@pytest.fixture(scope="module")
def browser(airflow, tmp_path_factory):
    if not (CHROMIUM and CHROMEDRIVER):
        reason = ("headless Chromium is not installed (need `chromium` and `chromedriver` on PATH: "
                  "apt-get install -y chromium chromium-driver; .ci/run does this)")
        if os.environ.get("SPARK_JOBS_REQUIRE_BROWSER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--no-first-run",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(90)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


# the pictures in docs/inspecting.md: taken from the real page when UPDATE_DOC_PICTURES=1
DOC_PICTURES = {"01-tables": "lake-page-tables", "06-chart": "lake-page-table-chart", "06b-rollup": "lake-page-rollup"}


def shot(driver, name: str) -> None:
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))
    if name in DOC_PICTURES and os.environ.get("UPDATE_DOC_PICTURES") == "1":
        (ROOT / "docs" / "images").mkdir(exist_ok=True)
        assert driver.save_screenshot(str(ROOT / "docs" / "images" / f"{DOC_PICTURES[name]}.png")), name


def wait_for(driver, css: str, timeout: float = 60) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def click_and_load(driver, element: Any, css: str, timeout: float = 60) -> Any:
    """Click something that loads a page, wait until the old page is gone, then for ``css`` on the new one
    (else a wait could find the old page's element and see it go stale)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    element.click()

    def gone(_: Any) -> bool:  # stale, or (Chrome mid-navigation) "Node ... does not belong to the document"
        try:
            old.is_enabled()
        except WebDriverException:
            return True
        return False

    WebDriverWait(driver, timeout).until(gone)
    return wait_for(driver, css, timeout)


def css(driver, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


@pytest.fixture(scope="module")
def page(browser, airflow):
    """The browser, logged in through Airflow's own login page, which sends it back to the lake view."""
    from selenium.webdriver.common.by import By

    browser.get(f"{airflow['base']}/lake/")
    wait_for(browser, "input[name=username]")
    assert "/auth/login" in browser.current_url
    shot(browser, "00-login")
    browser.find_element(By.NAME, "username").send_keys(airflow["user"])
    browser.find_element(By.NAME, "password").send_keys(airflow["password"])
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(browser, "#tables")
    assert browser.current_url == f"{airflow['base']}/lake/"
    return browser


def test_the_page_lists_the_tables(page, airflow):
    names = [a.text for a in css(page, "a.table-link")]
    assert names == TABLES
    row = css(page, "#tables tbody tr")[1]
    assert [td.text for td in row.find_elements("css selector", "td")][:2] == [AGG, "1"]
    shot(page, "01-tables")


def test_history_and_switching_versions(page, airflow):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    page.find_element(By.LINK_TEXT, AGG).click()
    wait_for(page, "#history")
    assert page.find_element(By.ID, "shown-version").text == "version 1"
    history = css(page, "#history tbody tr")
    assert [r.find_element(By.CSS_SELECTOR, "td").text for r in history] == ["1", "0"]
    assert f"txn {PIPELINE}.reduce=2" in history[0].text
    latest_rows = len(css(page, "#rows tbody tr"))
    assert latest_rows > 0
    shot(page, "02-table-latest")

    Select(page.find_element(By.ID, "version-select")).select_by_value("0")
    click_and_load(page, page.find_element(By.ID, "version-go"), "#rows")
    assert page.find_element(By.ID, "shown-version").text == "version 0"
    assert "version=0" in page.current_url
    shot(page, "03-table-version-0")

    where = page.find_element(By.ID, "where")
    where.clear()
    where.send_keys("page = '/d'")
    click_and_load(page, page.find_element(By.ID, "filter-go"), "#rows")
    assert page.find_element(By.ID, "rows").text == "(no rows)"  # /d only appears in version 1
    Select(page.find_element(By.ID, "version-select")).select_by_value("1")
    click_and_load(page, page.find_element(By.ID, "version-go"), "#rows tbody tr")
    pages = {r.find_elements(By.TAG_NAME, "td")[0].text for r in css(page, "#rows tbody tr")}
    assert pages == {"/d"}
    shot(page, "04-table-filtered")


def test_diff_between_two_versions(page, airflow):
    from selenium.webdriver.common.by import By

    page.get(f"{airflow['base']}/lake/table/{AGG}/diff?from=0&to=1")
    wait_for(page, "#diff-summary")
    added, removed, changed = (int(page.find_element(By.ID, i).text) for i in ("n-added", "n-removed", "n-changed"))
    assert added > 0 and removed > 0 and changed > 0
    assert len(css(page, "#diff-changed tbody tr")) == min(changed, 50)
    assert css(page, "#diff-changed .old") and css(page, "#diff-changed .new")
    shot(page, "05-diff")


def test_the_chart_renders(page, airflow):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    page.get(f"{airflow['base']}/lake/table/{AGG}/chart")
    wait_for(page, "#chart-svg")
    Select(page.find_element(By.ID, "metric-select")).select_by_value("total_ms")
    page.find_element(By.ID, "where").send_keys("page IN ('/b', '/c', '/d')")
    svg = click_and_load(page, page.find_element(By.ID, "chart-go"), "#chart-svg")
    assert "metric=total_ms" in page.current_url
    assert svg.size["width"] > 400 and svg.size["height"] > 200
    labels = [g.get_attribute("data-label") for g in css(page, "#chart-svg g.series")]
    assert labels == ["page=/b", "page=/c", "page=/d"]
    assert all(len(p.get_attribute("points").split()) >= 2 for p in css(page, "#chart-svg polyline"))
    shot(page, "06-chart")


def grid_rows(driver, table_css: str) -> list[dict[str, str]]:
    """A grid's rows as {header: cell text}."""
    from selenium.webdriver.common.by import By

    header = [th.text for th in css(driver, f"{table_css} thead th")]
    return [dict(zip(header, [td.text for td in tr.find_elements(By.TAG_NAME, "td")], strict=True))
            for tr in css(driver, f"{table_css} tbody tr")]


def test_a_rollup_by_hour_with_its_chart(page, airflow, inspect_lake, inspect_spec):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    before = snapshot(inspect_lake)
    page.get(f"{airflow['base']}/lake/table/{AGG}")
    click_and_load(page, wait_for(page, "#rollup-link"), "#rollup-rows")
    # the first visit shows the last day of data, every key, one bucket
    assert [page.find_element(By.ID, i).get_attribute("value") for i in ("from", "to", "by", "grain")] == [
        "2024-03-02 00:00", "2024-03-03 00:00", "page", "all"]
    assert [r["page"] for r in grid_rows(page, "#rollup-rows")] == ["/b", "/c", "/d"]

    grain = page.find_element(By.ID, "grain")
    grain.clear()
    grain.send_keys("1 hour")
    Select(page.find_element(By.ID, "metric-select")).select_by_value("total_ms")
    click_and_load(page, page.find_element(By.ID, "rollup-go"), "#chart-svg")
    assert "grain=1+hour" in page.current_url and "metric=total_ms" in page.current_url

    expected = direct_rollup(inspect_lake, inspect_spec, "2024-03-02", "2024-03-03", ("page",), 3600)
    assert expected.num_rows > 3 * 2  # several hours per page
    # every cell as the grid formats it (times in UTC, floats to 6 digits, NULL for an empty sum)
    assert grid_rows(page, "#rollup-rows") == [{k: cell(v) for k, v in r.items()} for r in expected.to_pylist()]
    assert page.find_element(By.ID, "rollup-caption").text.startswith(f"{expected.num_rows} rows")
    # the page's JSON link answers the same rollup
    status, _, text = http(page.find_element(By.ID, "rollup-json").get_attribute("href"), token=token(airflow))
    assert status == 200
    assert [(r["page"], r["start"], r["total_ms"]) for r in json.loads(text)] == [
        (r["page"], r["start"].isoformat(), r["total_ms"]) for r in expected.to_pylist()]

    svg = page.find_element(By.ID, "chart-svg")
    assert svg.size["width"] > 400 and svg.size["height"] > 200
    assert "total_ms by bucket start" in svg.get_attribute("aria-label")
    assert [g.get_attribute("data-label") for g in css(page, "#chart-svg g.series")] == ["page=/b", "page=/c",
                                                                                          "page=/d"]
    assert all(len(p.get_attribute("points").split()) >= 2 for p in css(page, "#chart-svg polyline"))
    assert len(css(page, "#chart-svg circle")) == sum(v is not None for v in expected["total_ms"].to_pylist())
    shot(page, "06b-rollup")

    start = page.find_element(By.ID, "from")
    start.clear()
    start.send_keys("2024-03-02 00:30")
    err = click_and_load(page, page.find_element(By.ID, "rollup-go"), "#rollup-error")
    assert err.text == ("--from 2024-03-02 00:30:00 cuts a 1 hour window; use a window boundary such as "
                        "2024-03-02 00:00:00 or 2024-03-02 01:00:00")
    assert page.find_element(By.ID, "from").get_attribute("value") == "2024-03-02 00:30"  # the form keeps the text
    assert css(page, "#rollup-rows") == [] and css(page, "#chart-svg") == []
    shot(page, "06c-rollup-cut-window")
    assert snapshot(inspect_lake) == before


def test_runs_reconcile(page, airflow):
    from selenium.webdriver.common.by import By

    page.find_element(By.ID, "nav-runs").click()
    wait_for(page, "#runs")
    rows = css(page, "#runs tbody tr")
    assert len(rows) == 5
    assert all(td.text == "yes" for td in css(page, "#runs td.yes")) and len(css(page, "#runs td.yes")) == 5
    shot(page, "07-runs")


def test_bad_input_in_the_browser_shows_a_clear_error(page, airflow, inspect_lake):
    from selenium.webdriver.common.by import By

    before = snapshot(inspect_lake)
    page.get(f"{airflow['base']}/lake/table/{AGG}?where=views%20%3E%201%3B%20DROP%20TABLE%20x")
    err = wait_for(page, "#rows-error")
    assert "bad filter at position 10: unexpected character ';'" in err.text
    shot(page, "08-bad-filter")
    page.get(f"{airflow['base']}/lake/table/{AGG}?version=99")
    assert "version 99 of views.aggregates does not exist; its versions are 0..1" in wait_for(page, "#error").text
    page.get(f"{airflow['base']}/lake/table/{AGG}?where=page%20%3D%20%27%3Cscript%3Ealert(1)%3C%2Fscript%3E%27")
    wait_for(page, "#rows")
    assert page.find_element(By.ID, "where").get_attribute("value") == "page = '<script>alert(1)</script>'"
    assert css(page, "script") == []  # echoed as text, never markup
    shot(page, "09-bad-version")
    assert snapshot(inspect_lake) == before


def test_the_page_is_embedded_in_the_airflow_ui(page, airflow):
    page.get(f"{airflow['base']}/plugin/lake")
    frame = wait_for(page, "iframe", timeout=90)
    page.switch_to.frame(frame)
    try:
        wait_for(page, "#tables", timeout=60)
        assert [a.text for a in css(page, "a.table-link")] == TABLES
    finally:
        page.switch_to.default_content()
    shot(page, "10-in-airflow-ui")
