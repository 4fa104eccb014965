"""Training that earns its promotion, on real runs (real broker, Iceberg table, the trainer in
this process): a model worse than its baseline is not promoted, and says why; the champion and
the challenger are scored on the same forward-tail rows (the stream's last part by event time,
never trained); early stopping picks the epoch count from the data, not from the cap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from slipstream.pipeline.registry import ModelRegistry, RegistryConfig
from slipstream.pipeline.run_metrics import parse_run_metrics
from slipstream.samples.spec import spec_from_dict
from slipstream.scoring import auc
from slipstream.stream.kafka import create_topic, produce_samples
from tests.trainer_fixtures import SamplesFixture, generated, make_samples, train_config

pytestmark = pytest.mark.integration


def _train(fx: SamplesFixture, bootstrap: str, topic: str, run_id: str, **sections: dict[str, Any]) -> dict[str, Any]:
    from trainers.config.schema import resolve
    from trainers.train import run

    raw = train_config(fx, run_id=run_id, bootstrap=bootstrap, topic=topic, dlq_topic=f"{topic}.dlq",
                       run={"checkpoint_every_steps": 1000, "log_every_steps": 100, "tensorboard": False})
    raw["data"]["forward_tail_share"] = 0.2  # type: ignore[index]  # the trainer's default: promotion is judged there
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)  # type: ignore[attr-defined]
    return run(resolve(raw, fx.settings), fx.settings)


def _stream_fixture(tmp_path: Path, bootstrap: str) -> tuple[SamplesFixture, str, pa.Table]:
    # a day of stream after T: ~800 rows in its forward tail
    fx = make_samples(tmp_path, days=2, per_day=4_000, row_group_rows=1_000, stream_minutes=1440.0)
    data = generated(tmp_path, fx)
    topic = f"samples-{tmp_path.name}"
    create_topic(bootstrap, topic, 2)
    produce_samples(bootstrap, topic, data.stream, progress_every=0)
    return fx, topic, data.stream


def _registry(fx: SamplesFixture) -> ModelRegistry:
    return ModelRegistry(RegistryConfig.from_env(fx.settings).location)


def test_a_model_worse_than_its_baseline_is_not_promoted_and_says_why(tmp_path: Path, kafka_bootstrap: str) -> None:
    fx, topic, _ = _stream_fixture(tmp_path, kafka_bootstrap)
    # a learning rate of (almost) 0: the model stays at its initial weights, the baseline learns
    s = _train(fx, kafka_bootstrap, topic, "frozen", data={"epochs": 2},
               optim={"lr": 1e-12, "stream_lr": 1e-12, "adaptive_stream_lr": False})
    tail = parse_run_metrics(s).evaluation.forward_tail
    assert tail is not None and tail.model is not None and tail.baseline is not None and tail.rows >= 400, tail
    assert (tail.baseline.auc or 0) > (tail.model.auc or 0) + 0.03, tail
    pkg = _registry(fx).publish(Path(fx.settings.runs_dir) / "frozen")
    d = pkg["decision"]
    assert not d["promoted"] and d["registered"] and d["evaluated_on"] == "forward_tail", d
    assert "does not beat its logistic-regression baseline" in d["reason"] and "forward-tail rows after T" in d["reason"], d
    assert _registry(fx).champion() is None  # not even as the first model


def _rescore(model_pt: Path, rows: pa.Table) -> float:
    """AUC of an exported model on `rows`, rebuilt from its file alone (not the trainer's scorer)."""
    from trainers.config.schema import ModelConfig
    from trainers.data.rows import Features, RowLayout, Rows
    from trainers.models import build_model

    blob = torch.load(model_pt, map_location="cpu", weights_only=True)
    spec = spec_from_dict(json.loads(blob["spec"]), str(model_pt))
    model = build_model(spec, ModelConfig(**blob["model_config"]), 0)
    model.load_state_dict(blob["state_dict"])
    model.eval()
    feats = Features.from_rows(Rows.from_arrow(rows, RowLayout.from_spec(spec), source=1))
    with torch.no_grad():
        p = torch.sigmoid(model(feats)).numpy()
    return auc(rows.column("label").to_numpy().astype(np.float64), p.astype(np.float64))


def test_champion_and_challenger_are_scored_on_the_same_forward_tail(tmp_path: Path, kafka_bootstrap: str) -> None:
    fx, topic, stream = _stream_fixture(tmp_path, kafka_bootstrap)
    a = parse_run_metrics(_train(fx, kafka_bootstrap, topic, "run-a", data={"epochs": 2}))
    first = _registry(fx).publish(Path(fx.settings.runs_dir) / "run-a")["decision"]
    if not first["promoted"]:  # the rule may refuse it; a person can still make it the champion
        _registry(fx).promote("run-a", "the champion this test compares against")
    b = parse_run_metrics(_train(fx, kafka_bootstrap, topic, "run-b", data={"epochs": 1, "seed": 3}))
    tail_a, tail_b = a.evaluation.forward_tail, b.evaluation.forward_tail
    assert tail_a is not None and tail_b is not None and b.evaluation.champion_run_id == "run-a"
    assert b.forward_tail_start == a.forward_tail_start and tail_b.rows == tail_a.rows >= 400, (tail_a, tail_b)

    # the forward tail nobody trained on, taken from the generator (not from the trainer's reader)
    assert b.forward_tail_start is not None
    start_us = int(b.forward_tail_start.timestamp() * 1_000_000)
    after = stream.filter(pc.greater_equal(pc.cast(stream.column("event_time"), pa.int64()), start_us))
    assert after.num_rows == tail_b.rows
    champion_auc = _rescore(Path(fx.settings.runs_dir) / "run-a" / "export" / "model.pt", after)
    challenger_auc = _rescore(Path(fx.settings.runs_dir) / "run-b" / "export" / "model.pt", after)
    assert tail_b.champion is not None and tail_b.model is not None
    assert tail_b.champion.auc == pytest.approx(champion_auc, abs=1e-6)
    assert tail_b.model.auc == pytest.approx(challenger_auc, abs=1e-6)
    # and the decision compares exactly those two numbers
    d = _registry(fx).publish(Path(fx.settings.runs_dir) / "run-b")["decision"]
    assert d["champion_run_id"] == "run-a" and d["champion_auc"] == pytest.approx(champion_auc, abs=1e-6)
    assert d["challenger_auc"] == pytest.approx(challenger_auc, abs=1e-6)


def test_early_stopping_picks_the_epoch_count_from_the_data(tmp_path: Path, kafka_bootstrap: str) -> None:
    """The same config (a cap of 6 epochs) on two data sets: an epoch over a small window is a few
    steps, so the validation loss still falls after several; on a window 12x larger it bottoms out
    early and the run stops before the cap."""
    runs = {}
    for per_day in (1_000, 12_000):
        home = tmp_path / f"d{per_day}"
        fx = make_samples(home, days=2, per_day=per_day, row_group_rows=4_000)
        topic = f"empty-{per_day}-{tmp_path.name}"
        create_topic(kafka_bootstrap, topic, 1)  # no stream: this is about the batch phase
        s = _train(fx, kafka_bootstrap, topic, f"es-{per_day}",
                   data={"epochs": 6, "batch_size": 256, "stream_batch_size": 256, "shuffle_buffer": 8_192})
        curve = s["validation_curve"]
        assert s["chosen_epoch"] is not None and len(curve) == s["epochs_run"] <= 6, s
        best = min(curve, key=lambda c: c["loss"])
        assert best["epoch"] == s["chosen_epoch"]  # the kept weights are the lowest validation loss
        runs[per_day] = s
    small, large = runs[1_000], runs[12_000]
    assert large["stopped_early"] and large["epochs_run"] < 6, large["validation_curve"]
    assert small["chosen_epoch"] > large["chosen_epoch"], (small["validation_curve"], large["validation_curve"])
