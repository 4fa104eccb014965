"""The failure callback's one-line summary, and the pod entry point that hands lineage to XCom."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from slipstream.pipeline.podrun import run as podrun


@dataclass
class FakeTI:
    """The attributes of a task instance the callback reads (Airflow passes its RuntimeTaskInstance)."""

    dag_id: str = "daily_retrain"
    task_id: str = "quality_gate"
    run_id: str = "scheduled__2025-01-03T00:00:00+00:00"
    try_number: int = 2
    map_index: int = -1
    log_url: str = "http://127.0.0.1:8080/dags/daily_retrain/runs/x/tasks/quality_gate?try_number=2"


def test_failure_line_names_task_error_and_log(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from slipstream_airflow.callbacks import log_failure

    monkeypatch.setenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", "/var/log/airflow")
    error = RuntimeError("3 critical expectations failed:\n  label in {0,1}: 12 rows")
    with caplog.at_level(logging.ERROR, logger="slipstream.failures"):
        log_failure({"ti": FakeTI(), "exception": error})
    (record,) = caplog.records
    line = record.getMessage()
    assert "\n" not in line
    assert line.startswith("FAILED daily_retrain.quality_gate run=scheduled__2025-01-03T00:00:00+00:00 try=2")
    assert "RuntimeError: 3 critical expectations failed: label in {0,1}: 12 rows" in line
    assert ("log: /var/log/airflow/dag_id=daily_retrain/run_id=scheduled__2025-01-03T00:00:00+00:00/"
            "task_id=quality_gate/attempt=2.log") in line
    assert "ui: http://127.0.0.1:8080/dags/daily_retrain" in line


def test_callback_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    from slipstream_airflow.callbacks import log_failure

    log_failure({"ti": object()})  # a broken context is logged, not raised
    assert "could not summarise" in caplog.text


def test_podrun_writes_lineage_for_the_xcom_sidecar(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "daily-1"
    metrics = {"run_id": "daily-1", "snapshot_id": 7, "handoff_offsets": {"0": 3}, "auc": 0.7, "big": list(range(1000))}
    write = f"import json,pathlib; p=pathlib.Path({str(run)!r}); p.mkdir(parents=True); (p/'metrics.json').write_text(json.dumps({metrics!r}))"
    xcom = tmp_path / "airflow" / "xcom" / "return.json"
    assert podrun([sys.executable, "-c", write], run, xcom) == 0
    lineage = json.loads(xcom.read_text())
    assert lineage["snapshot_id"] == 7 and lineage["handoff_offsets"] == {"0": 3}
    assert lineage["metrics_path"] == str(run / "metrics.json") and "big" not in lineage


def test_podrun_passes_the_trainer_exit_code(tmp_path: Path) -> None:
    xcom = tmp_path / "return.json"
    assert podrun([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "r", xcom) == 3
    assert not xcom.exists()
