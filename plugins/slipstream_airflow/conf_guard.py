"""Refuse, at trigger time, a run conf key that is none of a Slipstream DAG's params.

Airflow 3.3 validates a triggered run's conf against the DAG's params but lets a key that is no
param through (it becomes a param without a schema): `{"learning_rat": 0.1}` would be accepted and
ignored. This ASGI middleware, installed in the api-server by the UI plugin
(`fastapi_root_middlewares`, Airflow's extension point for the API's root app), reads the body of
`POST /api/v2/dags/<dag_id>/dagRuns` (the trigger form and the REST API) and of
`POST /api/v2/backfills`, and answers 400 with the unknown keys, the near miss of each and every
valid name — `slipstream.pipeline.request.unknown_keys_message`, the same line the first task fails
with when a run was created another way (`airflow dags test`). Only DAGs tagged `slipstream` are
checked, against their own params as the dag-processor serialized them; every other request passes
through untouched.
"""

from __future__ import annotations

import json
import logging
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

TAG = "slipstream"
TRIGGER = re.compile(r"/api/v2/dags/([^/]+)/dagRuns/?$")
BACKFILL = re.compile(r"/api/v2/backfills/?$")
MAX_BODY = 1 << 20
"""A trigger's body is small; a larger one is passed on unread (Airflow refuses it if it must)."""

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def dag_param_names(dag_id: str) -> set[str] | None:
    """The param names of a Slipstream DAG as serialized, or None (no such DAG, or not ours)."""
    from airflow.models.serialized_dag import SerializedDagModel

    dag = SerializedDagModel.get_dag(dag_id)
    if dag is None or TAG not in (dag.tags or ()):
        return None
    return set(dag.params.keys())


def conf_problem(path: str, body: bytes, names_of: Callable[[str], set[str] | None] = dag_param_names) -> str:
    """'' when the request may go on; else why its conf is refused."""
    from slipstream.pipeline.request import unknown_keys_message

    trigger, backfill = TRIGGER.search(path), BACKFILL.search(path)
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        return ""  # not JSON: Airflow answers it
    if not isinstance(doc, dict):
        return ""
    dag_id: Any
    if trigger:
        dag_id, conf = urllib.parse.unquote(trigger.group(1)), doc.get("conf")
    elif backfill:
        dag_id, conf = doc.get("dag_id"), doc.get("dag_run_conf")
    else:
        return ""
    if not isinstance(dag_id, str) or not isinstance(conf, dict) or not conf:
        return ""
    valid = names_of(dag_id)
    if valid is None:
        return ""
    problem = unknown_keys_message(conf, valid)
    return f"{dag_id}: {problem}" if problem else ""


class UnknownConfGuard:
    """The ASGI middleware (see the module docstring)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]],
                 names_of: Callable[[str], set[str] | None] | None = None) -> None:
        self.app = app
        self.names_of = names_of or dag_param_names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope.get("type") != "http" or scope.get("method") != "POST" or not (TRIGGER.search(path) or BACKFILL.search(path)):
            await self.app(scope, receive, send)
            return
        messages, body = [], b""
        while True:
            message = await receive()
            messages.append(message)
            if message.get("type") != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body") or len(body) > MAX_BODY:
                break
        problem = ""
        if len(body) <= MAX_BODY:
            import anyio.to_thread

            try:
                problem = await anyio.to_thread.run_sync(conf_problem, path, body, self.names_of)
            except Exception:  # noqa: BLE001 - the guard must never break triggering: Airflow still validates
                log.exception("could not check the conf of %s; passing it on", path)
        if problem:
            log.info("refused a trigger: %s", problem)
            payload = json.dumps({"detail": problem}).encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return

        async def replay() -> dict[str, Any]:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)
