"""`slipstream ui up` + a headless Chromium: log in, trigger daily_retrain with params from the
trigger form, see a bad value refused, see the good run created with the form's values. Needs
Debian's `chromium` and `chromium-driver`. (A run through the scheduler to success, its report
tab and a re-run: `test_airflow_datasets_rerun`.)"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from slipstream.pipeline.request import KNOBS
from slipstream.settings import Settings

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture
def airflow_ui(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from slipstream.dev import stack, ui
    from slipstream.dev.stack import free_port

    port = free_port()
    monkeypatch.setenv("SLIPSTREAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLIPSTREAM_KAFKA_PORT", str(port))
    monkeypatch.setenv("SLIPSTREAM_KAFKA_BOOTSTRAP", f"127.0.0.1:{port}")
    settings = Settings.from_env()
    try:
        info = ui.up(settings, port=free_port(), password="test-pass-123")
        yield info
    finally:
        ui.down(settings)
        stack.down(settings)


def _api(info: Any, path: str, token: str, body: dict | None = None, method: str | None = None) -> Any:  # type: ignore[type-arg]
    req = urllib.request.Request(f"{info.url}{path}", method=method or ("POST" if body is not None else "GET"),
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _token(info: Any) -> str:
    req = urllib.request.Request(f"{info.url}/auth/token", method="POST",
                                 data=json.dumps({"username": info.username, "password": info.password}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())["access_token"]


def _wait(what: str, fn: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except Exception:  # noqa: BLE001 - the server is still coming up
            pass
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _logged_in_browser(info: Any) -> tuple[Any, Any]:
    """(headless Chromium logged in to the UI with the printed login, a 30 s WebDriverWait)."""
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM  # type: ignore[assignment]
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    # React re-renders replace elements between finding and using them: a wait retries on that
    wait = WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,))
    try:
        for attempt in range(3):
            try:
                driver.get(info.url + "/")
                wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys(info.username)
                driver.find_element(By.NAME, "password").send_keys(info.password)
                driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
                wait.until(lambda d: "/auth/login" not in d.current_url)
                break
            except WebDriverException as e:  # the UI redirected (to its login page) while we typed: again
                if "navigat" not in str(e) or attempt == 2:
                    raise
    except BaseException:
        driver.quit()
        raise
    return driver, wait


def _click(wait: Any, find: Any) -> None:
    """Click the first element `find(driver)` returns, once there is one; found and
    clicked in one try of the wait, so a re-render in between makes it try again."""
    def attempt(d: Any) -> bool:
        found = find(d)
        if not found:
            return False
        d.execute_script("arguments[0].scrollIntoView()", found[0])
        d.execute_script("arguments[0].click()", found[0])  # a toast may cover it
        return True

    wait.until(attempt)


def _buttons(text: str) -> Any:
    from selenium.webdriver.common.by import By

    return lambda d: [b for b in d.find_elements(By.CSS_SELECTOR, "button") if b.text.strip() == text]


@pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="headless Chromium missing: sudo apt-get install -y chromium chromium-driver")
def test_trigger_form_refuses_bad_param_and_triggers(airflow_ui: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec

    info = airflow_ui
    token = _token(info)  # the login `ui up` printed works
    _wait("the dag-processor to publish daily_retrain", lambda: _api(info, "/api/v2/dags/daily_retrain", token), 150)

    driver, wait = _logged_in_browser(info)
    try:
        def open_form() -> None:
            driver.get(info.url + "/dags/daily_retrain")
            _click(wait, _buttons("Trigger"))
            wait.until(ec.presence_of_element_located((By.NAME, "element_stream_stop")))

        open_form()
        sections = {k.name: k.section for k in KNOBS}

        def set_param(name: str, value: str) -> None:
            def shown(d: Any) -> bool:  # the params sit in folded sections: open the field's, as a person would
                if d.find_element(By.NAME, f"element_{name}").is_displayed():
                    return True
                trigger = _buttons(sections[name])(d)
                if trigger and trigger[0].get_attribute("aria-expanded") != "true":
                    d.execute_script("arguments[0].scrollIntoView({block: 'center'})", trigger[0])
                    trigger[0].click()  # a real click: the accordion ignores a scripted one
                return False

            wait.until(shown)

            def attempt(d: Any) -> bool:  # again from the start if the field was re-rendered meanwhile
                field = d.find_element(By.NAME, f"element_{name}")
                field.send_keys(Keys.CONTROL + "a", Keys.DELETE)
                field.send_keys(value)
                return True

            wait.until(attempt)

        def submit() -> None:  # the dialog's button, once the form has taken the values and enabled it
            _click(wait, lambda d: [b for b in d.find_elements(By.CSS_SELECTOR, "[data-testid=trigger-dag-submit]")
                                    if b.is_enabled()])

        def fill(stream_stop: str) -> None:
            set_param("window_days", "3")
            set_param("epochs", "2")
            set_param("stream_stop", stream_stop)

        fill("soon")  # neither 'caught_up' nor seconds
        submit()
        refusal = wait.until(lambda d: [ln for ln in d.find_element(By.TAG_NAME, "body").text.splitlines()
                                        if "Invalid input for param stream_stop" in ln])
        assert "does not match" in refusal[0]
        driver.save_screenshot(str(tmp_path / "refused.png"))

        # after a refused trigger, Airflow 3.3's form now and then stops submitting (its button stays
        # disabled, or a click sends nothing: the form's own state, not ours): start again from a
        # fresh form, as a person would
        open_form()
        fill("20")
        submit()
        wait.until(lambda d: "/runs/" in d.current_url)
        driver.save_screenshot(str(tmp_path / "triggered.png"))
    finally:
        driver.quit()
    assert (tmp_path / "refused.png").stat().st_size > 10_000 and (tmp_path / "triggered.png").stat().st_size > 10_000

    runs = _api(info, "/api/v2/dags/daily_retrain/dagRuns", token)["dag_runs"]
    manual = [r for r in runs if r["run_type"] == "manual"]
    assert len(manual) == 1, runs  # the refused trigger created nothing
    conf = manual[0]["conf"]
    assert conf["window_days"] == 3 and conf["epochs"] == 2 and conf["stream_stop"] == "20"


def _get(url: str, token: str | None = None) -> tuple[int, str, str]:
    """(status, final URL, body) of a GET, following redirects."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.url, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, url, e.read().decode()


def test_each_dag_run_links_to_its_insight_report(airflow_ui: Any, tmp_path: Path) -> None:
    """The UI plugin: an "Insight report" tab on a DAG run shows the run folder's report.html,
    behind Airflow's login; the browser part runs where headless Chromium is installed."""
    from datetime import datetime

    from slipstream.pipeline.runlayout import make_run_id

    info = airflow_ui
    token = _token(info)
    plugins = _api(info, "/api/v2/plugins", token)["plugins"]
    ours = [p for p in plugins if p["name"] == "slipstream"]
    assert ours and {v["destination"] for v in ours[0]["external_views"]} == {"dag_run", "nav"}, plugins
    _wait("the dag-processor to publish daily_retrain", lambda: _api(info, "/api/v2/dags/daily_retrain", token), 150)
    # what the trigger form is built from: titles in words, sections, bounds and defaults in each description
    params = _api(info, "/api/v2/dags/daily_retrain/details", token)["params"]
    assert params["lr"]["schema"]["title"] == "Learning rate" and params["lr"]["schema"]["section"] == "Training"
    assert params["window_days"]["description"].endswith("A whole number of days from 1 to 3650. Default: 7.")
    logical = datetime(2026, 11, 3, tzinfo=UTC)
    run = _api(info, "/api/v2/dags/daily_retrain/dagRuns", token,
               {"logical_date": logical.isoformat(), "conf": {}})  # the DAG is paused: the run waits, untouched
    dag_run_id = run["dag_run_id"]
    # what the `report` task of that run would write into its run folder
    folder = Path(Settings.from_env().runs_dir) / make_run_id("daily", datetime(2026, 11, 4, tzinfo=UTC), dag_run_id)
    folder.mkdir(parents=True)
    (folder / "report.html").write_text(f"<html><body><h1>Training-data insight — run {folder.name}</h1></body></html>")

    report_url = f"{info.url}/slipstream/dag_runs/daily_retrain/{urllib.parse.quote(dag_run_id, safe='')}/report"
    assert _get(report_url)[0] == 401  # no login, no report
    status, final, body = _get(report_url, token)
    assert status == 200 and final.endswith(f"/slipstream/runs/{folder.name}/report.html")
    assert f"Training-data insight — run {folder.name}" in body
    status, _, body = _get(f"{info.url}/slipstream/runs", token)
    assert status == 200 and folder.name in body
    # the admin passes Airflow's DAG-level check; the file comes sandboxed; another DAG's tab for
    # the same run id does not show this run's report
    req = urllib.request.Request(final, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Security-Policy"] == "sandbox"
    other = f"{info.url}/slipstream/dag_runs/preprocess_samples/{urllib.parse.quote(dag_run_id, safe='')}/report"
    status, _, body = _get(other, token)
    assert status == 404 and folder.name not in body

    if not (CHROMIUM and DRIVER):
        pytest.skip("the API part passed; the browser part needs: sudo apt-get install -y chromium chromium-driver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    driver, wait = _logged_in_browser(info)
    try:
        driver.get(f"{info.url}/dags/daily_retrain/runs/{urllib.parse.quote(dag_run_id, safe='')}")
        _click(wait, lambda d: d.find_elements(By.XPATH, "//*[normalize-space(text())='Insight report']"))
        frame = wait.until(lambda d: [f for f in d.find_elements(By.TAG_NAME, "iframe")
                                      if "slipstream/dag_runs" in (f.get_attribute("src") or "")])
        driver.switch_to.frame(frame[0])
        heading = wait.until(ec.presence_of_element_located((By.TAG_NAME, "h1"))).text
        driver.switch_to.default_content()
        driver.save_screenshot(str(tmp_path / "report-tab.png"))
    finally:
        driver.quit()
    assert heading == f"Training-data insight — run {folder.name}"
    assert (tmp_path / "report-tab.png").stat().st_size > 10_000
