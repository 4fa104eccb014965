"""Model quality under concept drift: the stream tail must pay off.

The generator changes its hidden click model at T (dense weights flip sign, category effects are
permuted, the history effect turns negative). A model trained on the window only is then near or
below chance after T; with the trainer's default stream-phase settings (`data.stream_batch_size`,
`optim.stream_lr`) a few thousand fresh samples, each trained once, must move it clearly ahead:
on the stream itself (each row scored before it trained, against the batch-only model on the same
rows) and on the forward tail (the stream's last fifth, never trained).
The stationary goal (within 0.01 of the best achievable AUC) needs a window far larger than a
test can train: `slipstream bench model_quality` measures it (docs/trainer.md, Model quality).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slipstream.pipeline.run_metrics import parse_run_metrics
from slipstream.stream.kafka import create_topic, produce_samples
from tests.trainer_fixtures import generated, make_samples, train_config

pytestmark = pytest.mark.integration


def test_batch_plus_stream_is_clearly_ahead_of_batch_only_under_drift(tmp_path: Path, kafka_bootstrap: str) -> None:
    from trainers.config.schema import resolve
    from trainers.train import run

    # a day of stream: ~7,000 rows scored before training, ~2,000 in the forward tail
    fx = make_samples(tmp_path, days=2, per_day=10_000, row_group_rows=2_000, drift=True, stream_minutes=1440.0)
    data = generated(tmp_path, fx)
    topic = f"samples-drift-{tmp_path.name}"
    create_topic(kafka_bootstrap, topic, 4)
    produce_samples(kafka_bootstrap, topic, data.stream, progress_every=0)
    raw = train_config(fx, run_id="drift", bootstrap=kafka_bootstrap, topic=topic, dlq_topic=f"{topic}.dlq",
                       data={"batch_size": 256, "epochs": 2, "forward_tail_share": 0.2,
                             # the whole tail, even on a loaded machine (the default cap is 60 s)
                             "stop": {"mode": "caught_up", "timeout_s": 600}},
                       run={"checkpoint_every_steps": 1000, "log_every_steps": 50, "tensorboard": False})
    # the stream phase runs on the trainer's defaults: that is what this test is about
    for key in ("replay_share", "stream_shuffle_buffer", "stream_batch_size"):
        raw["data"].pop(key)  # type: ignore[attr-defined]
    s = run(resolve(raw, fx.settings), fx.settings)

    ev = parse_run_metrics(s).evaluation
    pre, tail = ev.prequential, ev.forward_tail
    assert pre is not None and tail is not None and pre.vs_batch_only is not None and tail.vs_batch_only is not None
    detail = {"prequential": pre.model_dump(), "forward_tail": tail.model_dump(), "samples_kafka": s["samples_kafka"]}
    print("model quality under drift:", detail)  # shown with pytest -rP
    assert pre.rows == s["samples_kafka"] >= 6_000 and tail.rows >= 1_500, detail
    # the stream lift on the stream's own rows, shown (its lower bound), and clearly ahead where it ends
    assert (pre.vs_batch_only.lo or 0) > 0.03, f"the stream should lift the model above batch-only: {detail}"
    assert (tail.vs_batch_only.diff or 0) >= 0.08, f"the stream should move the model clearly ahead of batch-only: {detail}"
