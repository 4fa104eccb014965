"""The Airflow UI plugin's pages: run list, run files, a DAG run's report, login and DAG access
required, third-party HTML sandboxed."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import HTTPException
from fastapi.testclient import TestClient

from slipstream.pipeline.runlayout import make_run_id
from slipstream.settings import Settings
from slipstream_airflow.report_views import create_app

DONE_RUN = "scheduled__2026-11-04T00:00:00+00:00"
BUSY_RUN = "manual__2026-11-05T09:30:00+00:00"


def _run(settings: Settings, dag_run_id: str, day: int, stages: dict[str, Any], files: dict[str, str]) -> Path:
    path = Path(settings.runs_dir) / make_run_id("daily", datetime(2026, 11, day, tzinfo=UTC), dag_run_id)
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps(stages))
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Settings, Path, Path]:
    settings = Settings(home=tmp_path / "home")
    done = _run(settings, DONE_RUN, 4, {"preprocess": {}, "quality": {}, "train": {}, "report": {}},
                {"report.html": "<h1>Training-data insight — run done</h1>"})
    busy = _run(settings, BUSY_RUN, 5, {"preprocess": {}, "quality": {}},
                {"quality/window_2026-11-02.html": "<p>gate</p>", "quality/gx_data_docs/w/index.html": "<p>gx</p>"})
    (tmp_path / "home" / "secret.txt").write_text("not a run file")
    return settings, done, busy


def _client(settings: Settings, **kw: Any) -> TestClient:
    return TestClient(create_app(settings_of=lambda: settings, **kw))


def test_run_list_links_each_report(runs: tuple[Settings, Path, Path]) -> None:
    settings, done, busy = runs
    page = _client(settings).get("/runs")
    assert page.status_code == 200
    assert f"href='runs/{done.name}/report.html'" in page.text
    assert busy.name in page.text and "no report yet" in page.text
    assert "preprocess, quality, train, report" in page.text  # the steps each run got through


def test_run_files_are_served_and_nothing_outside_the_run(runs: tuple[Settings, Path, Path]) -> None:
    settings, done, busy = runs
    client = _client(settings)
    report = client.get(f"/runs/{done.name}/report.html")
    assert report.status_code == 200 and "Training-data insight" in report.text
    assert report.headers["content-type"].startswith("text/html")
    assert client.get(f"/runs/{busy.name}/quality/window_2026-11-02.html").text == "<p>gate</p>"
    for path in (f"/runs/{done.name}/..%2F..%2Fsecret.txt", f"/runs/{done.name}/%2e%2e/%2e%2e/secret.txt",
                 "/runs/..%2F/secret.txt", f"/runs/{done.name}/missing.html"):
        assert client.get(path).status_code == 404, path


def test_a_dag_run_opens_its_report(runs: tuple[Settings, Path, Path]) -> None:
    settings, done, _ = runs
    resp = _client(settings).get(f"/dag_runs/daily_retrain/{DONE_RUN}/report", follow_redirects=False)
    assert resp.status_code == 307
    assert resp.headers["location"].endswith(f"/runs/{done.name}/report.html")
    followed = _client(settings).get(f"/dag_runs/daily_retrain/{DONE_RUN}/report")
    assert "Training-data insight" in followed.text


def test_a_dag_run_without_report_says_what_is_done(runs: tuple[Settings, Path, Path]) -> None:
    settings, _, busy = runs
    resp = _client(settings).get(f"/dag_runs/daily_retrain/{BUSY_RUN}/report")
    assert resp.status_code == 404
    assert busy.name in resp.text and "no insight report yet" in resp.text
    assert "Steps done so far: preprocess, quality." in resp.text
    assert f"/runs/{busy.name}/quality/window_2026-11-02.html" in resp.text  # the gate's page, linked
    assert f"/runs/{busy.name}/quality/gx_data_docs/w/index.html" in resp.text
    unknown = _client(settings).get("/dag_runs/daily_retrain/manual__never/report")
    assert unknown.status_code == 404 and "No Slipstream run folder" in unknown.text


def test_every_page_needs_the_login(runs: tuple[Settings, Path, Path]) -> None:
    settings, done, _ = runs

    def no_user() -> None:
        raise HTTPException(401, "Not authenticated")

    client = _client(settings, auth=no_user)
    for path in ("/runs", f"/runs/{done.name}/report.html", f"/dag_runs/daily_retrain/{DONE_RUN}/report"):
        assert client.get(path, follow_redirects=False).status_code == 401, path


def test_airflow_finds_the_plugin_in_the_plugins_folder() -> None:
    from airflow._shared.plugins_manager.plugins_manager import _load_plugins_from_plugin_directory

    folder = Path(__file__).resolve().parents[2] / "plugins"
    plugins, errors = _load_plugins_from_plugin_directory(plugins_folder=str(folder))
    assert errors == {}
    ours = [p for p in plugins if p.name == "slipstream"]
    assert len(ours) == 1
    views = {v["destination"]: v for v in ours[0].external_views}
    assert views["dag_run"]["href"] == "slipstream/dag_runs/{DAG_ID}/{RUN_ID}/report"
    assert views["nav"]["href"] == "slipstream/runs"
    assert [a["url_prefix"] for a in ours[0].fastapi_apps] == ["/slipstream"]


def test_a_dag_run_finds_only_its_own_dags_run(runs: tuple[Settings, Path, Path]) -> None:
    """daily_retrain and preprocess_samples share `scheduled__<date>` run ids: one DAG's tab must
    not show the other's report (issue 23, item 12)."""
    settings, done, _ = runs
    client = _client(settings)
    assert client.get(f"/dag_runs/daily_retrain/{DONE_RUN}/report", follow_redirects=False).status_code == 307
    other = client.get(f"/dag_runs/preprocess_samples/{DONE_RUN}/report", follow_redirects=False)
    assert other.status_code == 404 and done.name not in other.text


def test_pages_need_access_to_the_dag_the_run_belongs_to(runs: tuple[Settings, Path, Path]) -> None:
    settings, done, busy = runs
    manual = Path(settings.runs_dir) / "by-hand-7"  # a trainer run started by hand: no DAG made it
    (manual / "report.html").parent.mkdir(parents=True)
    (manual / "report.html").write_text("<p>manual</p>")
    asked: list[tuple[str, str | None]] = []

    def can_read_dag(user: str, dag_id: str | None) -> bool:
        asked.append((user, dag_id))
        return dag_id == "stream_train"  # this user reads stream_train's runs only

    client = _client(settings, auth=lambda: "bob", can_read_dag=can_read_dag)
    for path in (f"/dag_runs/daily_retrain/{DONE_RUN}/report", f"/runs/{done.name}/report.html",
                 f"/runs/{busy.name}/quality/window_2026-11-02.html", "/runs/by-hand-7/report.html"):
        assert client.get(path, follow_redirects=False).status_code == 403, path
    listing = client.get("/runs")
    assert listing.status_code == 200 and done.name not in listing.text and "by-hand-7" not in listing.text
    assert ("bob", "daily_retrain") in asked and ("bob", None) in asked  # a DAG-less run needs every DAG
    admin = _client(settings, auth=lambda: "root", can_read_dag=lambda user, dag_id: True)
    assert admin.get(f"/runs/{done.name}/report.html").status_code == 200
    assert "by-hand-7" in admin.get("/runs").text


def test_run_files_are_served_sandboxed(runs: tuple[Settings, Path, Path]) -> None:
    """GX Data Docs is HTML a library wrote from data: it must not run script as the Airflow UI."""
    settings, done, busy = runs
    client = _client(settings)
    for path in (f"/runs/{busy.name}/quality/gx_data_docs/w/index.html", f"/runs/{done.name}/report.html"):
        resp = client.get(path)
        assert resp.status_code == 200 and resp.headers["content-security-policy"] == "sandbox", path
        assert resp.headers["x-content-type-options"] == "nosniff"


def test_a_re_run_dag_run_shows_its_latest_attempt_and_lists_the_earlier(runs: tuple[Settings, Path, Path]) -> None:
    """A DAG run cleared after its data changed trained twice: its tab shows attempt 2's report and
    lists attempt 1 (its report marked superseded), never attempt 1's report as if it were current."""
    from slipstream.pipeline.runlayout import RunInfo, write_run_info

    settings, done, _ = runs
    write_run_info(done, RunInfo(dag_id="daily_retrain", dag_run_id=DONE_RUN, dataset="synthetic"))
    second = done.parent / f"{done.name}-a2"
    second.mkdir()
    (second / "summary.json").write_text(json.dumps({"attempt": {}, "preprocess": {}, "train": {}, "report": {}}))
    (second / "report.html").write_text("<h1>Training-data insight — attempt 2</h1>")
    write_run_info(second, RunInfo(dag_id="daily_retrain", dag_run_id=DONE_RUN, dataset="synthetic", attempt=2,
                                   reason="the plan changed since attempt 1: files, snapshot_id"))
    client = _client(settings)
    page = client.get(f"/dag_runs/daily_retrain/{DONE_RUN}/report", follow_redirects=False)
    assert page.status_code == 200
    text = page.text
    assert "<b>Attempt 2</b>" in text and "the plan changed since attempt 1: files, snapshot_id" in text
    assert f"/runs/{second.name}/report.html" in text.split("Earlier attempts")[0]  # the latest, shown first
    earlier = text.split("Earlier attempts")[1]
    assert f"/runs/{done.name}/report.html" in earlier and "superseded by attempt 2" in earlier
    listing = client.get("/runs").text
    assert "(attempt 2)" in listing and "superseded by a later attempt" in listing
