"""The pages behind Slipstream's Airflow UI plugin: run folders, their reports, a DAG run's report.

A FastAPI app the api-server mounts under `/slipstream` (see `ui_plugin`). It serves what the
pipeline already wrote under SLIPSTREAM_RUNS_DIR — the insight report, the quality gate's page,
GX Data Docs — and finds the run folder of an Airflow DAG run from its DAG id and run id
(`make_run_id` ends every run id of a DAG run with a digest of it; the DAG's own run kinds scope
the search, since two DAGs share run ids such as `scheduled__<date>`).

Every page needs a logged-in Airflow user (`auth`, Airflow's own `get_user` in the api-server) who
may read the runs of the DAG the page belongs to (`can_read_dag(user, dag_id)`, Airflow's auth
manager in the api-server; `dag_id` None for a run folder no DAG made, which needs access to every
DAG). Files from the runs volume are served with `Content-Security-Policy: sandbox`: a page such as
GX Data Docs (HTML written by a third-party library from data) runs in an origin of its own, never
with the Airflow session's.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Callable

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from slipstream.errors import SlipstreamError
from slipstream.pipeline.runlayout import (
    REPORT_FILE, RUN_ID_PATTERN, RunListing, dag_of_run, list_runs, run_dir, run_dirs_of_dag_run, run_listing,
)
from slipstream.settings import Settings

SANDBOXED = {"Content-Security-Policy": "sandbox", "X-Content-Type-Options": "nosniff"}
"""Headers of every file served from a run folder: its HTML runs no script with Airflow's origin."""
CanReadDag = Callable[[Any, "str | None"], bool]

PAGE_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1f2933}"
    "table{border-collapse:collapse}td,th{padding:.3rem .8rem;border-bottom:1px solid #d9e2ec;text-align:left}"
    ".muted{color:#627d98}"
)


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{PAGE_STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>",
        status_code=status,
    )


def _run_html_files(path: Path) -> list[str]:
    """The HTML pages of a run folder a person opens, relative to it: the report first, then the
    quality gate's pages and GX Data Docs' index pages."""
    pages = [REPORT_FILE] if (path / REPORT_FILE).is_file() else []
    quality = path / "quality"
    if quality.is_dir():
        pages += sorted(str(p.relative_to(path)) for p in quality.glob("*.html"))
        pages += sorted(str(p.relative_to(path)) for p in quality.glob("gx_data_docs/*/index.html"))
    return pages


def _runs_table(runs: list[RunListing]) -> str:
    """The runs as a table; links are relative to the list's own URL (`<prefix>/runs`)."""
    rows = []
    for r in runs:
        link = (f"<a href='runs/{html.escape(r.run_id)}/{REPORT_FILE}'>insight report</a>"
                if r.has_report else "<span class='muted'>no report yet</span>")
        rows.append(
            f"<tr><td>{html.escape(r.run_id)}</td><td>{r.modified:%Y-%m-%d %H:%M} UTC</td>"
            f"<td>{html.escape(', '.join(r.stages)) or '-'}</td><td>{link}</td></tr>"
        )
    return ("<table><tr><th>run</th><th>last change</th><th>steps done</th><th></th></tr>"
            + "".join(rows) + "</table>")


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
        return _page("Slipstream runs", f"<p>{html.escape(str(exc))}</p>", status=500)

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
        readable = {dag: allowed(user, dag) for dag in {dag_of_run(r.run_id) for r in listed}}
        runs = [r for r in listed if readable[dag_of_run(r.run_id)]]
        if not runs:
            return _page("Slipstream runs", f"<p>No run folders you may read under {html.escape(settings.runs_dir)} "
                                            "yet: trigger daily_retrain (or stream_train) and come back.</p>")
        return _page("Slipstream runs", f"<p class='muted'>{len(runs)} newest under {html.escape(settings.runs_dir)}</p>"
                     + _runs_table(runs))

    @app.get("/runs/{run_id}/{path:path}", name="run_file")
    def run_file(run_id: str, path: str, user: Any = who) -> FileResponse:
        require(user, dag_of_run(run_id))
        base = folder(run_id).resolve()
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
            return _page(title, (
                f"<p>No Slipstream run folder for this run of {html.escape(dag_id)} under {html.escape(settings.runs_dir)}. "
                "Its first task creates it: the run has not started a task yet, this DAG writes no run "
                "folder, or the api-server's SLIPSTREAM_RUNS_DIR differs from the workers'.</p>"), status=404)
        with_report = [p for p in found if (p / REPORT_FILE).is_file()]
        if with_report:
            return RedirectResponse(file_url(request, with_report[0].name, REPORT_FILE), status_code=307)
        path = found[0]
        done = run_listing(path).stages
        links = "".join(
            f"<li><a href='{html.escape(file_url(request, path.name, p))}'>{html.escape(p)}</a></li>"
            for p in _run_html_files(path)
        )
        return _page(title, (
            f"<p>Run <b>{html.escape(path.name)}</b> has no insight report yet: the <code>report</code> task "
            f"writes it as the run's last step. Steps done so far: {html.escape(', '.join(done)) or 'none'}.</p>"
            + (f"<p>Pages written so far:</p><ul>{links}</ul>" if links else "")
        ), status=404)

    return app
