"""No evaluated row was trained before it was scored, checked on a real run (broker, Iceberg table,
the trainer in this process) by reading what it committed: the audit of trained ids
(`audit/`) against the ids each evaluation scored (`evaluated/`), independently of the trainer's
own counts.

- the validation days: scored every epoch, never trained, never replayed;
- the prequential stream: each row trained exactly once, in the step right after the one whose
  model scored it;
- the forward tail (the stream's last fifth by event time): scored at the end, never trained;
- the hash hold-outs: never trained; the replayed rows: rows the batch phase trained.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slipstream.pipeline.run_metrics import parse_run_metrics
from slipstream.stream.kafka import create_topic, produce_samples
from tests.trainer_fixtures import generated, make_samples, train_config
from trainers.observe.sample_audit import read_audit, read_evaluated

pytestmark = pytest.mark.integration


def _ids(t: pa.Table, source: str) -> list[str]:
    return t.filter(pc.equal(t.column("source"), source)).column("sample_id").to_pylist()


def test_no_evaluated_row_is_trained_before_it_is_scored(tmp_path: Path, kafka_bootstrap: str) -> None:
    from trainers.config.schema import resolve
    from trainers.train import run

    fx = make_samples(tmp_path, days=3, per_day=2_500, row_group_rows=1_000, stream_minutes=600.0)
    data = generated(tmp_path, fx)
    topic = f"samples-honest-{tmp_path.name}"
    create_topic(kafka_bootstrap, topic, 2)
    produce_samples(kafka_bootstrap, topic, data.stream, progress_every=0)
    raw = train_config(fx, run_id="honest", bootstrap=kafka_bootstrap, topic=topic, dlq_topic=f"{topic}.dlq", window_days=3,
                       data={"epochs": 2, "forward_tail_share": 0.2, "stream_shuffle_buffer": 64,
                             "stream_batch_size": 64, "replay_share": 0.25},
                       run={"checkpoint_every_steps": 20, "log_every_steps": 50, "tensorboard": False})
    m = parse_run_metrics(run(resolve(raw, fx.settings), fx.settings))
    run_dir = Path(fx.settings.runs_dir) / "honest"
    trained, scored = read_audit(run_dir), read_evaluated(run_dir)
    trained_ids = set(_ids(trained, "iceberg")) | set(_ids(trained, "kafka"))

    validation = set(_ids(scored, "validation"))
    assert len(validation) > 1_000 and not validation & trained_ids
    replayed = set(_ids(scored, "replay"))
    assert replayed and replayed <= set(_ids(trained, "iceberg")) and not replayed & validation

    # prequential: each stream row scored by the model of step s, trained (once) in step s + 1
    pre = scored.filter(pc.equal(scored.column("source"), "prequential"))
    kafka = trained.filter(pc.equal(trained.column("source"), "kafka"))
    assert max(Counter(_ids(scored, "prequential")).values()) == 1 and max(Counter(_ids(trained, "kafka")).values()) == 1
    scored_at = dict(zip(pre.column("sample_id").to_pylist(), pre.column("step").to_pylist(), strict=True))
    trained_at = dict(zip(kafka.column("sample_id").to_pylist(), kafka.column("step").to_pylist(), strict=True))
    assert scored_at.keys() == trained_at.keys() and len(scored_at) == m.samples_kafka > 500
    assert all(trained_at[i] == s + 1 for i, s in scored_at.items())
    assert m.evaluation.prequential is not None and m.evaluation.prequential.rows == m.samples_kafka

    # the forward tail: every record from its start on, never trained, scored by the final model
    tail = set(_ids(scored, "forward_tail"))
    start = m.forward_tail_start
    assert isinstance(start, datetime) and m.evaluation.forward_tail is not None
    times = data.stream.column("event_time")
    expected = set(data.stream.filter(pc.greater_equal(times, pa.scalar(start, times.type))).column("sample_id").to_pylist())
    assert tail == expected and m.evaluation.forward_tail.rows == len(tail) > 150 and not tail & trained_ids
    assert not set(_ids(scored, "holdout_after_t")) & (trained_ids | tail)
    assert not set(_ids(scored, "holdout_before_t")) & trained_ids

    # what the summary says was held for the tail is what the stream holds there (the hash
    # hold-out of the tail counted with the hold-out)
    assert m.forward_tail_stream + m.holdout_stream >= len(tail)
    assert m.auc_on == "forward_tail" and m.auc_rows == len(tail)
