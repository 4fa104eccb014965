"""`stream_train` launches a continuous-mode training with a fixed run id, so a restart resumes it."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from slipstream.settings import Settings
from tests.airflow_fixtures import STANDIN_TRAINER, airflow, airflow_cli_env, migrated_airflow_db, use_airflow_db  # noqa: F401

pytestmark = pytest.mark.integration


def test_stream_train_runs_the_continuous_trainer(settings: Settings, catalog, migrated_airflow_db: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from slipstream.dev.datagen import GeneratorConfig, reference_samples
    from slipstream.lake.iceberg import samples_table

    table = samples_table(catalog, settings.namespace)
    for tbl in reference_samples(GeneratorConfig(start_day=date(2025, 1, 1), days=2, impressions_per_day=200)).values():
        table.append(tbl)
    snapshot = table.refresh().current_snapshot().snapshot_id

    env = airflow_cli_env(settings.home)
    env["SLIPSTREAM_TRAINER_MODULE"] = STANDIN_TRAINER  # the real trainer would run until stopped
    use_airflow_db(migrated_airflow_db, settings.home)
    conf = json.dumps({"stream_name": "ctr", "export_every_min": 5, "cpu_processes": 2})
    out = airflow(["dags", "test", "stream_train", "-c", conf], env)
    assert out.returncode == 0 and "state=success" in out.stdout + out.stderr, out.stdout[-3000:] + out.stderr[-3000:]

    run = Path(settings.runs_dir) / "stream-ctr"
    config = json.loads((run / "config.json").read_text())
    assert config["data.stop.mode"] == "continuous" and config["data.stop.export_every_min"] == "5"
    assert config["run.resume"] == "true" and config["run.run_id"] == "stream-ctr"
    assert config["data.snapshot_id"] == str(snapshot)
    assert config["data.t_handoff"].startswith("2025-01-03T00:00:00")  # right after the newest batch day
    assert "data.stop.duration_s" not in config and "data.stream" not in config
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stream"]["snapshot_id"] == snapshot
