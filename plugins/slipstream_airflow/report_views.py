"""The pages behind Slipstream's Airflow UI plugin: run folders, their reports, a DAG run's report.

A FastAPI app the api-server mounts under `/slipstream` (see `ui_plugin`). It serves what the
pipeline already wrote under SLIPSTREAM_RUNS_DIR — the insight report, the quality gate's page,
GX Data Docs — and finds the run folders of an Airflow DAG run from its DAG id and run id
(`runlayout.run_dirs_of_dag_run`: every run id of a DAG run carries a digest of it, and a folder's
run.json names its DAG and DAG run, since two DAGs share run ids such as `scheduled__<date>`). A
DAG run that trained more than once (re-run after its plan changed) has one folder per attempt: its
page shows the latest attempt's report and lists the earlier attempts, each marked as superseded.

Every page needs a logged-in Airflow user (`auth`, Airflow's own `get_user` in the api-server) who
may read the runs of the DAG the page belongs to (`can_read_dag(user, dag_id)`, Airflow's auth
manager in the api-server; `dag_id` None for a run folder no DAG made, which needs access to every
DAG). Files from the runs volume are served with `Content-Security-Policy: sandbox`: a page such as
GX Data Docs (HTML written by a third-party library from data) runs in an origin of its own, never
with the Airflow session's.
Its own pages are Jinja2 templates in `templates/`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from slipstream.errors import SlipstreamError
from slipstream.pipeline.runlayout import (
    REPORT_FILE,
    RUN_ID_PATTERN,
    attempt_of,
    dag_of_run,
    list_runs,
    run_dir,
    run_dirs_of_dag_run,
    run_listing,
)
from slipstream.settings import Settings
from slipstream.templating import render

SANDBOXED = {"Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff"}
"""Headers of every file served from a run folder: its HTML runs no script with Airflow's origin."""
CanReadDag = Callable[[Any, "str | None"], bool]


def _page(template: str, status: int = 200, **context: Any) -> HTMLResponse:
    """One of this plugin's pages (`templates/*.html.j2`, Jinja2, autoescaped)."""
    return HTMLResponse(render("slipstream_airflow", template, **context), status_code=status)


def _run_html_files(path: Path) -> list[str]:
    """The HTML pages of a run folder a person opens, relative to it: the report first, then the
    quality gate's pages and GX Data Docs' index pages."""
    pages = [REPORT_FILE] if (path / REPORT_FILE).is_file() else []
    quality = path / "quality"
    if quality.is_dir():
        pages += sorted(str(p.relative_to(path)) for p in quality.glob("*.html"))
        pages += sorted(str(p.relative_to(path)) for p in quality.glob("gx_data_docs/*/index.html"))
    return pages


def create_app(settings_of: Callable[[], Settings] = Settings.from_env, auth: Callable[..., Any] | None = None,
               can_read_dag: CanReadDag | None = None) -> FastAPI:
    """The app; `settings_of` is read on every request (the runs dir of the api-server's
    environment), `auth` is a FastAPI dependency resolving the user every route requires,
    `can_read_dag(user, dag_id)` says whether that user may read a DAG's runs (None: everyone)."""

    async def anyone() -> None:
        return None

    who = Depends(auth or anyone)  # a default, not an Annotated alias: annotations here are strings
    app = FastAPI(title="Slipstream run reports", docs_url=None, redoc_url=None, openapi_url=None)

    def allowed(user: Any, dag_id: str | None) -> bool:
        return can_read_dag is None or can_read_dag(user, dag_id)

    def require(user: Any, dag_id: str | None) -> None:
        if not allowed(user, dag_id):
            raise HTTPException(403, f"no access to the runs of {dag_id or 'every DAG'}")

    @app.exception_handler(SlipstreamError)
    def config_error(request: Request, exc: SlipstreamError) -> HTMLResponse:  # e.g. a runs dir on S3
        return _page("message.html.j2", status=500, title="Slipstream runs", message=str(exc))

    def file_url(request: Request, run_id: str, path: str) -> str:
        # the path under the mount point (root_path): `request.url_for` looks names up in the
        # api-server's own router, which does not know this mounted app's routes
        return str(request.scope.get("root_path", "")) + app.url_path_for("run_file", run_id=run_id, path=path)

    def folder(run_id: str) -> Path:
        if not RUN_ID_PATTERN.fullmatch(run_id):
            raise HTTPException(404, f"{run_id!r} is not a run id")
        return run_dir(settings_of(), run_id)

    @app.get("/runs", response_class=HTMLResponse)
    def runs_page(user: Any = who) -> HTMLResponse:
        settings = settings_of()
        listed = list_runs(settings)
        dags = {r.run_id: dag_of_run(r.run_id, r.path) for r in listed}
        readable = {dag: allowed(user, dag) for dag in set(dags.values())}
        runs = [r for r in listed if readable[dags[r.run_id]]]
        newest: dict[str, int] = {}
        for r in listed:
            base, number = attempt_of(r.run_id)
            newest[base] = max(newest.get(base, 0), number)
        superseded = {r.run_id for r in listed if attempt_of(r.run_id)[1] < newest[attempt_of(r.run_id)[0]]}
        return _page("runs.html.j2", title="Slipstream runs", runs=runs, runs_dir=settings.runs_dir,
                     report_file=REPORT_FILE, superseded=superseded)

    @app.get("/runs/{run_id}/{path:path}", name="run_file")
    def run_file(run_id: str, path: str, user: Any = who) -> FileResponse:
        base = folder(run_id).resolve()
        require(user, dag_of_run(run_id, base))
        target = (base / path).resolve()
        if not target.is_relative_to(base) or not target.is_file():
            raise HTTPException(404, f"run {run_id} has no file {path!r}")
        return FileResponse(target, headers=SANDBOXED)

    @app.get("/dag_runs/{dag_id}/{dag_run_id}/report", response_class=HTMLResponse, response_model=None)
    def dag_run_report(dag_id: str, dag_run_id: str, request: Request, user: Any = who) -> HTMLResponse | RedirectResponse:
        require(user, dag_id)
        settings = settings_of()
        found = run_dirs_of_dag_run(settings, dag_id, dag_run_id)
        title = f"{dag_id} · {dag_run_id}"
        if not found:
            return _page("dag_run_pending.html.j2", status=404, title=title, run_id=None, runs_dir=settings.runs_dir)
        latest = found[0]  # the latest attempt: the one the run's tasks work on now
        if len(found) == 1 and (latest / REPORT_FILE).is_file():
            return RedirectResponse(file_url(request, latest.name, REPORT_FILE), status_code=307)
        pages = [(p, file_url(request, latest.name, p)) for p in _run_html_files(latest)]
        if len(found) == 1:
            return _page("dag_run_pending.html.j2", status=404, title=title, run_id=latest.name,
                         done=run_listing(latest).stages, pages=pages)
        attempts = [(run_listing(p), file_url(request, p.name, REPORT_FILE) if (p / REPORT_FILE).is_file() else None)
                    for p in found]
        return _page("attempts.html.j2", title=title, latest=attempts[0], earlier=attempts[1:], pages=pages)

    return app
