"""A trigger whose conf has a key that is no param of the DAG is refused by the API with the key, its
near miss and the valid names; every other request passes through with its body intact."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from slipstream_airflow.conf_guard import UnknownConfGuard, conf_problem

PARAMS = {"window_days", "epochs", "lr", "stream_stop"}


def _names(dag_id: str) -> set[str] | None:
    return PARAMS if dag_id.startswith("daily_retrain") else None  # any other DAG: not Slipstream's


def test_conf_problem_names_the_key_and_the_valid_ones() -> None:
    body = json.dumps({"logical_date": None, "conf": {"learning_rat": 0.1, "epochs": 2}}).encode()
    problem = conf_problem("/api/v2/dags/daily_retrain__criteo/dagRuns", body, _names)
    assert problem == ("daily_retrain__criteo: unknown parameter 'learning_rat' in the run's conf ('learning_rat': did you "
                       "mean 'lr'?); the valid names are: epochs, lr, stream_stop, window_days")
    assert conf_problem("/api/v2/dags/daily_retrain/dagRuns", json.dumps({"conf": {"lr": 0.1}}).encode(), _names) == ""
    assert conf_problem("/api/v2/dags/someone_elses/dagRuns", json.dumps({"conf": {"x": 1}}).encode(), _names) == ""
    backfill = json.dumps({"dag_id": "daily_retrain", "from_date": "2025-01-01", "to_date": "2025-01-02",
                           "dag_run_conf": {"epoch": 1}}).encode()
    assert "'epoch': did you mean 'epochs'?" in conf_problem("/api/v2/backfills", backfill, _names)


def test_the_middleware_refuses_before_airflow_and_passes_the_rest() -> None:
    seen: list[Any] = []
    app = FastAPI()

    @app.post("/api/v2/dags/{dag_id}/dagRuns")
    async def trigger(dag_id: str, request: Request) -> dict[str, Any]:
        body = await request.json()
        seen.append(body)
        return {"dag_run_id": "manual__x", "conf": body.get("conf")}

    app.add_middleware(UnknownConfGuard, names_of=_names)
    client = TestClient(app)
    refused = client.post("/api/v2/dags/daily_retrain/dagRuns", json={"conf": {"learning_rat": 0.1}})
    assert refused.status_code == 400 and "'learning_rat': did you mean 'lr'?" in refused.json()["detail"]
    assert seen == []  # Airflow never saw it: no run was created
    ok = client.post("/api/v2/dags/daily_retrain/dagRuns", json={"conf": {"lr": 0.01, "epochs": 3}})
    assert ok.status_code == 200 and ok.json()["conf"] == {"lr": 0.01, "epochs": 3} and len(seen) == 1
    other = client.post("/api/v2/dags/someone_elses/dagRuns", json={"conf": {"anything": 1}})
    assert other.status_code == 200
