"""`airflow dags test daily_retrain` end to end on the embedded stack (the demo's path), with the
real Spark preprocessing, quality gate, cache warmup, trainer and report."""

from __future__ import annotations

import json
import shutil
from datetime import date, timedelta
from pathlib import Path

import pytest

from slipstream.pipeline.run_metrics import read_run_metrics
from slipstream.settings import Settings
from tests.airflow_fixtures import airflow, airflow_cli_env, migrated_airflow_db, use_airflow_db  # noqa: F401

pytestmark = pytest.mark.integration

@pytest.mark.skipif(shutil.which("java") is None, reason="Java 17 is needed by the Spark preprocessing")
def test_daily_retrain_runs_end_to_end(settings: Settings, kafka_bootstrap: str, tmp_path: Path, migrated_airflow_db: Path) -> None:  # noqa: F811
    from slipstream.dev.datagen import GeneratorConfig, generate, write_manifest
    from slipstream.stream.kafka import create_topic, produce_samples

    cfg = GeneratorConfig(start_day=date(2025, 1, 1), days=2, impressions_per_day=3000, users=300, items=80, stream_minutes=20)
    data = generate(cfg, settings.raw_dir)
    write_manifest(data, settings.home / "generator" / "manifest.json")
    topic = f"samples-e2e-{tmp_path.name}"[:100]
    create_topic(kafka_bootstrap, topic, 2)
    produce_samples(kafka_bootstrap, topic, data.stream)

    env = airflow_cli_env(settings.home)
    env.update({"SLIPSTREAM_KAFKA_BOOTSTRAP": kafka_bootstrap, "SLIPSTREAM_TOPIC": topic,
                "SLIPSTREAM_TOPIC_PARTITIONS": "2"})
    use_airflow_db(migrated_airflow_db, settings.home)
    t_day = cfg.start_day + timedelta(days=cfg.days)  # logical date T: data interval = the last raw day
    conf = {"window_days": 2, "epochs": 1, "stream_stop": "caught_up", "cpu_processes": 2, "batch_size": 256}
    out = airflow(["dags", "test", "daily_retrain", t_day.isoformat(), "-c", json.dumps(conf)], env, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "state=success" in out.stdout + out.stderr

    (run,) = [p for p in Path(settings.runs_dir).iterdir() if p.name.startswith(f"daily-{t_day:%Y%m%d}-")]
    _check_first_run(settings, run)

    # Clear of train_local (or its retry) with nothing changed: the attempt goes on. The launch of
    # the same plan in the same folder resumes the finished run, which the trainer does not train
    # again: same metrics, no second attempt.
    from slipstream.pipeline.cluster import ClusterSettings
    from slipstream.pipeline.jobspec import build_train_spec
    from slipstream.pipeline.runplan import read_plan
    from slipstream_airflow.local_launch import LocalTorchrunOperator

    info = json.loads((run / "run.json").read_text())
    assert (info["dag_id"], info["attempt"]) == ("daily_retrain", 1)
    before = (run / "metrics.json").read_bytes()
    here = Settings.from_env(env)
    cluster = ClusterSettings.from_env(env)
    lineage = LocalTorchrunOperator(task_id="train_local").run_spec(build_train_spec(here, cluster, read_plan(run / "plan.json")))
    assert lineage["run_id"] == run.name and (run / "metrics.json").read_bytes() == before
    assert sorted(p.name for p in run.parent.iterdir()) == [run.name]


def _check_first_run(settings: Settings, run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["preprocess"]["days"]) == {"2025-01-01", "2025-01-02"}
    assert summary["train"]["snapshot_id"] == summary["preprocess"]["snapshot_id"]
    assert (run / "report.html").exists()
    metrics = read_run_metrics(run)
    # the publish task decided by the rule, on the forward tail (6,000 rows and one epoch learn
    # little: model quality is asserted by the demo and model-quality tests on more data)
    decision = summary["publish"]  # judged on the forward tail, or on the validation days without one
    tail = metrics.evaluation.forward_tail
    assert decision["evaluated_on"] == ("forward_tail" if tail is not None and tail.scored else "validation")
    judged = tail if decision["evaluated_on"] == "forward_tail" else metrics.evaluation.validation
    shown = judged is not None and judged.vs_baseline is not None and (judged.vs_baseline.lo or 0) > 0
    assert decision["promoted"] is shown and decision["registered"] and decision["reason"], decision
    assert metrics.samples_iceberg > 0 and metrics.samples_kafka > 0
    assert judged is not None and judged.model is not None
    assert summary["publish"]["challenger_auc"] == pytest.approx(judged.model.auc)


@pytest.mark.parametrize("conf, named", [
    ({"learning_rat": 0.1}, ["'learning_rat'", "lr", "window_days"]),  # a typo: refused, not ignored
    ({"nnodes": 2}, ["nnodes=2 needs backend=kubernetes"]),            # a configuration error
])
def test_a_bad_conf_fails_at_once_naming_the_key(settings: Settings, migrated_airflow_db: Path, conf: dict,  # noqa: F811
                                                 named: list[str]) -> None:
    """Both fail the first task without a retry (AirflowFailException), before any data is touched
    (issue 23, item 8)."""
    env = airflow_cli_env(settings.home)
    use_airflow_db(migrated_airflow_db, settings.home)
    out = airflow(["dags", "test", "daily_retrain", "2025-01-03", "-c", json.dumps(conf)], env, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0 or "state=failed" in text, text[-4000:]
    assert "AirflowFailException" in text and "configuration error, not retried" in text, text[-4000:]
    for name in named:
        assert name in text, (name, text[-4000:])
    assert "up_for_retry" not in text and "UP_FOR_RETRY" not in text
    assert not any(Path(settings.runs_dir).glob("daily-*/summary.json"))  # nothing ran
