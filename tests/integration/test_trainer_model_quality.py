"""Model quality under concept drift: the stream tail must pay off.

The generator changes its hidden click model at T (dense weights flip sign, category effects are
permuted, the history effect turns negative). A model trained on the window only is then near or
below chance after T; with the trainer's default stream-phase settings (`data.stream_batch_size`,
`optim.stream_lr`) a few thousand fresh samples, each trained once, must move it clearly ahead.
The stationary goal (within 0.01 of the best achievable AUC) needs a window far larger than a
test can train: `slipstream bench model_quality` measures it (docs/trainer.md, Model quality).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slipstream.stream.kafka import create_topic, produce_samples
from tests.trainer_fixtures import generated, make_samples, train_config

pytestmark = pytest.mark.integration


def test_batch_plus_stream_is_clearly_ahead_of_batch_only_under_drift(tmp_path: Path, kafka_bootstrap: str) -> None:
    from trainers.config.schema import resolve
    from trainers.train import run

    # a day of stream: ~1,000 held-out rows after T, so a gap of 0.08 is several standard errors
    fx = make_samples(tmp_path, days=2, per_day=10_000, row_group_rows=2_000, drift=True, stream_minutes=1440.0)
    data = generated(tmp_path, fx)
    topic = f"samples-drift-{tmp_path.name}"
    create_topic(kafka_bootstrap, topic, 4)
    produce_samples(kafka_bootstrap, topic, data.stream, progress_every=0)
    raw = train_config(fx, run_id="drift", bootstrap=kafka_bootstrap, topic=topic, dlq_topic=f"{topic}.dlq",
                       data={"batch_size": 256, "epochs": 2,
                             # the whole tail, even on a loaded machine (the default cap is 60 s)
                             "stop": {"mode": "caught_up", "timeout_s": 600}},
                       run={"checkpoint_every_steps": 1000, "log_every_steps": 50, "tensorboard": False})
    # the stream phase runs on the trainer's defaults: that is what this test is about
    for key in ("replay_share", "stream_shuffle_buffer", "stream_batch_size"):
        raw["data"].pop(key)  # type: ignore[attr-defined]
    s = run(resolve(raw, fx.settings), fx.settings)

    ahead = s["auc_after_t"] - s["auc_after_t_batch_only"]
    detail = {k: s[k] for k in ("auc_after_t", "auc_after_t_batch_only", "best_auc_after_t", "eval_rows_after_t",
                                "samples_kafka")}
    print("model quality under drift:", detail)  # shown with pytest -rP
    assert s["eval_rows_after_t"] >= 800 and s["samples_kafka"] >= 8_000, detail
    assert ahead >= 0.08, f"the stream tail should move the model clearly ahead of batch-only: {detail}"
