"""The pages behind Slipstream's Airflow UI plugin: run folders, their reports, a DAG run's report.

A FastAPI app the api-server mounts under `/slipstream` (see `ui_plugin`). It serves what the
pipeline already wrote under SLIPSTREAM_RUNS_DIR — the insight report, the quality gate's page,
GX Data Docs — and finds the run folder of an Airflow DAG run from its run id (`make_run_id` ends
every run id of a DAG run with a digest of it). Its own pages are Jinja2 templates in
`templates/`. Every page needs a logged-in Airflow user: the
caller passes `auth`, the dependency that resolves one (Airflow's own `get_user` in the
api-server).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from slipstream.errors import SlipstreamError
from slipstream.pipeline.runlayout import (
    REPORT_FILE, RUN_ID_PATTERN, list_runs, run_dir, run_dirs_of_dag_run, run_listing,
)
from slipstream.settings import Settings
from slipstream.templating import render


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


def create_app(settings_of: Callable[[], Settings] = Settings.from_env, auth: Callable[..., Any] | None = None) -> FastAPI:
    """The app; `settings_of` is read on every request (the runs dir of the api-server's
    environment), `auth` is a FastAPI dependency every route requires."""
    deps = [Depends(auth)] if auth is not None else []
    app = FastAPI(title="Slipstream run reports", dependencies=deps, docs_url=None, redoc_url=None, openapi_url=None)

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
    def runs_page() -> HTMLResponse:
        settings = settings_of()
        return _page("runs.html.j2", title="Slipstream runs", runs=list_runs(settings), runs_dir=settings.runs_dir,
                     report_file=REPORT_FILE)

    @app.get("/runs/{run_id}/{path:path}", name="run_file")
    def run_file(run_id: str, path: str) -> FileResponse:
        base = folder(run_id).resolve()
        target = (base / path).resolve()
        if not target.is_relative_to(base) or not target.is_file():
            raise HTTPException(404, f"run {run_id} has no file {path!r}")
        return FileResponse(target)

    @app.get("/dag_runs/{dag_id}/{dag_run_id}/report", response_class=HTMLResponse, response_model=None)
    def dag_run_report(dag_id: str, dag_run_id: str, request: Request) -> HTMLResponse | RedirectResponse:
        settings = settings_of()
        found = run_dirs_of_dag_run(settings, dag_run_id)
        title = f"{dag_id} · {dag_run_id}"
        if not found:
            return _page("dag_run_pending.html.j2", status=404, title=title, run_id=None, runs_dir=settings.runs_dir)
        with_report = [p for p in found if (p / REPORT_FILE).is_file()]
        if with_report:
            return RedirectResponse(file_url(request, with_report[0].name, REPORT_FILE), status_code=307)
        path = found[0]
        pages = [(p, file_url(request, path.name, p)) for p in _run_html_files(path)]
        return _page("dag_run_pending.html.j2", status=404, title=title, run_id=path.name,
                     done=run_listing(path).stages, pages=pages)

    return app
