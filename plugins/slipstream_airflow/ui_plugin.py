"""Slipstream's Airflow UI plugin: each DAG run links to its insight report.

Airflow loads this file from the plugins folder. The api-server mounts `report_views` under
`/slipstream` (behind Airflow's login) and the UI shows:
- an **Insight report** tab on every DAG run (daily_retrain, stream_train) for users who may read
  that DAG's runs: the run's
  `report.html`, or, until the `report` task has written it, which steps are done and the pages
  written so far (the quality gate's page, GX Data Docs);
- **Slipstream runs** under Browse: the newest run folders with links to their reports.

It also installs `conf_guard.UnknownConfGuard` in the api-server: a trigger whose conf has a key
that is none of the DAG's params is refused with a 400 naming it and the valid ones.
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from slipstream_airflow.conf_guard import UnknownConfGuard

URL_PREFIX = "/slipstream"


class LazyReportApp:
    """The report pages as an ASGI app built on its first request: every Airflow process loads
    plugins (the scheduler, the dag-processor, each task), and only the api-server serves pages,
    so the others do not pay for importing FastAPI and Airflow's auth (~1 s)."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from airflow.api_fastapi.core_api.security import get_user

            from slipstream_airflow.report_views import create_app

            self._app = create_app(auth=get_user, can_read_dag=can_read_dag_runs)
        await self._app(scope, receive, send)


def can_read_dag_runs(user: Any, dag_id: str | None) -> bool:
    """Whether Airflow's auth manager lets `user` read the runs of `dag_id` (of every DAG when None):
    the check Airflow's own `requires_access_dag("GET", DagAccessEntity.RUN)` makes for its run pages."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
    from airflow.models.dag import DagModel

    details = DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id)) if dag_id else None
    return get_auth_manager().is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, details=details, user=user)


class SlipstreamUiPlugin(AirflowPlugin):
    name = "slipstream"
    fastapi_apps = [{"app": LazyReportApp(), "url_prefix": URL_PREFIX, "name": "Slipstream run reports"}]
    fastapi_root_middlewares = [{"middleware": UnknownConfGuard, "args": [], "kwargs": {},
                                 "name": "Slipstream: refuse conf keys that are no param"}]
    # hrefs are relative to the api-server's base URL; Airflow fills in {DAG_ID} and {RUN_ID}
    external_views = [
        {"name": "Insight report", "href": f"{URL_PREFIX.lstrip('/')}/dag_runs/{{DAG_ID}}/{{RUN_ID}}/report",
         "destination": "dag_run", "url_route": "slipstream-report"},
        {"name": "Slipstream runs", "href": f"{URL_PREFIX.lstrip('/')}/runs", "destination": "nav",
         "category": "browse", "url_route": "slipstream-runs"},
    ]
