"""Historical days run, and a logical date a DAG cannot honour is refused: `airflow dags test` of
`daily_retrain` dated in 2014 (Avazu's days) runs its tasks instead of succeeding with none, and a
date whose day is not over fails its first task with the reason, not retried."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slipstream.settings import Settings
from tests.airflow_fixtures import airflow, airflow_cli_env, migrated_airflow_db, use_airflow_db  # noqa: F401

pytestmark = pytest.mark.integration


def _dags_test(settings: Settings, template: Path, day: str, conf: dict) -> str:  # type: ignore[type-arg]
    env = airflow_cli_env(settings.home)
    use_airflow_db(template, settings.home)
    out = airflow(["dags", "test", "daily_retrain", day, "-c", json.dumps(conf)], env, timeout=300)
    return out.stdout + out.stderr


def test_a_2014_day_runs_its_tasks(settings: Settings, migrated_airflow_db: Path) -> None:  # noqa: F811
    # a conf typo fails the first task at once: proof that the 2014 run has tasks at all
    text = _dags_test(settings, migrated_airflow_db, "2014-10-24", {"learning_rat": 0.1})
    assert "running task <TaskInstance: daily_retrain.preprocess" in text, text[-4000:]
    assert "AirflowFailException" in text and "'learning_rat'" in text, text[-4000:]
    assert "logical_date=2014-10-24" in text and "state=failed" in text and "state=success" not in text, text[-4000:]


def test_a_day_that_is_not_over_is_refused(settings: Settings, migrated_airflow_db: Path) -> None:  # noqa: F811
    tomorrow = (datetime.now(UTC) + timedelta(days=2)).date().isoformat()
    text = _dags_test(settings, migrated_airflow_db, tomorrow, {})
    assert "AirflowFailException" in text and "ends in the future" in text and "cannot be trained on yet" in text, text[-4000:]
    assert "UP_FOR_RETRY" not in text and "up_for_retry" not in text and "state=failed" in text
