"""`stream_train` launches a continuous-mode training with a fixed run id, so a restart resumes it,
also after the next daily commit (it keeps the plan of the checkpoint it resumes)."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pyarrow.compute as pc
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


class _TaskInstance:
    """What `render_stream_job` uses of Airflow's task instance: an XCom push."""

    def __init__(self) -> None:
        self.pushed: dict[str, object] = {}

    def xcom_push(self, key: str, value: object) -> None:
        self.pushed[key] = value


def _render(params: dict[str, object]) -> tuple[dict[str, object], object]:
    from types import SimpleNamespace

    from slipstream.pipeline.datasets import DatasetRef
    from slipstream_airflow.jobxcom import JOB_XCOM_KEY, RenderedJob
    from slipstream_airflow.stream_tasks import render_stream_job

    ti = _TaskInstance()
    context = {"ti": ti, "dag": SimpleNamespace(dag_id="stream_train"), "dag_run": SimpleNamespace(run_id="manual__1")}
    out = render_stream_job(context, params, DatasetRef("synthetic", "synthetic"))
    return out, RenderedJob.from_xcom(ti.pushed[JOB_XCOM_KEY])  # type: ignore[arg-type]


def _launch(spec, **sets: str):  # type: ignore[no-untyped-def]
    """The rendered job with test-sized knobs (`--set`, as an experiment would): small model, frequent checkpoints."""
    from slipstream.pipeline.jobspec import TrainJobSpec

    knobs = {"model.buckets.user_id": "2003", "model.buckets.item_id": "1009", **{f"model.buckets.{c}": "101" for c in ("device_hash", "country_hash", "category_hash")},
             "model.embed_dim": "8", "model.bottom_mlp": "[16]", "model.top_mlp": "[16]", "data.stream_batch_size": "64",
             "data.stream_shuffle_buffer": "64", "run.checkpoint_every_steps": "3", "run.checkpoint_every_s": "0.3",
             "run.tensorboard": "false", **sets}
    return TrainJobSpec.from_dict({**spec.to_dict(), "overrides": {**spec.overrides, **knobs}})


def test_a_restart_after_the_next_daily_commit_resumes_the_stream_run(
        settings: Settings, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """stream_train renders and starts, is stopped, a new day lands in `samples`, it renders and
    starts again: the trainer resumes its checkpoint in the same run folder with the plan it started
    with, and no sample is trained twice (the exactly-once audit of the committed progress)."""
    import threading
    import time

    from slipstream.dev.datagen import GeneratorConfig, reference_samples
    from slipstream.stream.kafka import create_topic, produce_samples
    from slipstream_airflow.local_launch import LocalTorchrunOperator
    from tests.trainer_fixtures import (
        assert_trained_once,
        checkpoint_meta,
        generated,
        in_stream_with_progress,
        make_samples,
        stream_ids,
        training_ids,
    )
    from trainers.observe.sample_audit import read_audit

    fx = make_samples(settings.home, days=1, per_day=1500, row_group_rows=500, stream_minutes=240.0)
    data = generated(settings.home, fx)
    topic = f"stream-restart-{settings.home.parent.name}"[:100]
    create_topic(kafka_bootstrap, topic, 4)
    half = data.stream.num_rows // 2
    produce_samples(kafka_bootstrap, topic, data.stream.slice(0, half))
    for key, value in {"SLIPSTREAM_KAFKA_BOOTSTRAP": kafka_bootstrap, "SLIPSTREAM_TOPIC": topic, "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(key, value)
    # an export every 3 s: the DAG's freshness record (event -> exported model, the live model's AUC)
    params = {"stream_name": "ctr", "export_every_min": 0.05, "cpu_processes": 2, "window_days": 1, "batch_size": 64}
    run = Path(settings.runs_dir) / "stream-ctr"

    first, job = _render(params)
    assert first["snapshot_id"] == fx.snapshot_id and first["t_handoff"] == fx.t_handoff.isoformat()
    op = LocalTorchrunOperator(task_id="train", kill_grace_s=5)
    failed: list[BaseException] = []

    def train() -> None:
        try:
            op.run_spec(_launch(job.spec))  # continuous: runs until stopped
        except BaseException as e:  # noqa: BLE001 - the stop makes torchrun exit non-zero
            failed.append(e)

    worker = threading.Thread(target=train, daemon=True)
    worker.start()
    deadline = time.monotonic() + 240
    while not ((m := checkpoint_meta(run)) and in_stream_with_progress(m) and (run / "freshness.jsonl").exists()):
        assert worker.is_alive() and time.monotonic() < deadline, f"no stream checkpoint with progress: {failed}"
        time.sleep(0.05)
    op.on_kill()  # the task is stopped (a deploy, a crash): torchrun and its workers go
    worker.join(60)
    assert not worker.is_alive() and failed
    stopped = checkpoint_meta(run)
    assert stopped is not None and stopped["phase"] == "stream"
    # each export recorded how fresh the model was and how the live model scored the rows since
    # the previous export (each scored before it trained), the newest also in the run's summary
    exports = [json.loads(line) for line in (run / "freshness.jsonl").read_text().splitlines()]
    assert any(e["event_to_export_s_p99"] is not None and e["rows"] > 0 for e in exports), exports
    assert json.loads((run / "summary.json").read_text())["freshness"] == exports[-1]
    assert any((e["live_prequential"] or {}).get("rows", 0) > 0 for e in exports), exports

    # the next daily commit lands: a fresh plan would pin a newer snapshot and a later T
    day2 = reference_samples(GeneratorConfig(start_day=fx.t_handoff.date(), days=1, impressions_per_day=300, seed=99))
    for tbl in day2.values():
        fx.table.append(tbl)
    assert fx.table.refresh().current_snapshot().snapshot_id != fx.snapshot_id  # type: ignore[union-attr]
    produce_samples(kafka_bootstrap, topic, data.stream.slice(half))  # the stream went on meanwhile

    again, job2 = _render(params)
    assert again["snapshot_id"] == fx.snapshot_id and again["t_handoff"] == fx.t_handoff.isoformat()
    assert json.loads((run / "summary.json").read_text())["stream"]["resumed_plan"] is True
    lineage = LocalTorchrunOperator(task_id="train").run_spec(_launch(job2.spec, **{"data.stop.mode": "caught_up"}))

    metrics = json.loads((run / "metrics.json").read_text())
    assert lineage["run_id"] == "stream-ctr" and metrics["snapshot_id"] == fx.snapshot_id
    assert metrics["kafka_lag_at_stop"] == 0 and metrics["step"] > int(stopped["step"])  # type: ignore[call-overload]
    audit = read_audit(run)
    assert_trained_once(audit, "iceberg", training_ids(fx))  # the first day only: the plan's window
    assert_trained_once(audit, "kafka", stream_ids(data.stream, fx.t_handoff))
    iceberg_steps = audit.filter(pc.equal(audit.column("source"), "iceberg")).column("step").to_pylist()
    assert max(iceberg_steps) <= int(stopped["step"])  # type: ignore[call-overload]  # the batch phase was not redone
