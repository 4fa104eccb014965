"""data.exchange on a real 2-process torchrun: every rank's batches mix all partitions, and the
stream is still trained exactly once, straight through and across a kill -9 and resume.

The audit records each trained row's partition and offset per rank, so "which partitions did
rank 0 train" is read straight from `audit/rank-0.parquet` (and from the parts of a killed run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from slipstream.stream.kafka import create_topic, end_offsets, produce_samples
from tests.trainer_fixtures import (
    SamplesFixture,
    assert_trained_once,
    checkpoint_meta,
    generated,
    in_stream_with_progress,
    make_samples,
    run_torchrun,
    start_and_kill,
    stream_ids,
    train_config,
    training_ids,
)
from trainers.checkpoint.statefile import decode_state
from trainers.data.kafka_source import assigned_partitions
from trainers.observe.sample_audit import read_audit

pytestmark = pytest.mark.integration

PARTITIONS = 4


@dataclass
class Runs:
    fx: SamplesFixture
    home: Path
    topic: str
    bootstrap: str
    expected_stream: set[str]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Runs:
    home = tmp_path_factory.mktemp("exchange")
    fx = make_samples(home, days=1, per_day=2000, row_group_rows=500, stream_minutes=240.0)
    data = generated(home, fx)
    topic = f"exchange-{home.name}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    produce_samples(kafka_bootstrap, topic, data.stream)
    for run_id, exchange in (("off", False), ("on", True)):
        cfg = train_config(fx, run_id=run_id, bootstrap=kafka_bootstrap, topic=topic, dlq_topic=topic + ".dlq",
                           window_days=1, data={"exchange": exchange, "batch_size": 64})
        cfg_path = home / f"train-{run_id}.json"
        cfg_path.write_text(json.dumps(cfg))
        proc = run_torchrun(home, cfg_path, nproc=2)
        assert proc.returncode == 0, proc.stderr[-4000:]
    return Runs(fx, home, topic, kafka_bootstrap, stream_ids(data.stream, fx.t_handoff))


def _kafka_partitions(run_dir: Path, rank: int) -> set[int]:
    t = pq.read_table(run_dir / "audit" / f"rank-{rank}.parquet")
    t = t.filter(pc.equal(t.column("source"), "kafka"))
    return set(t.column("partition").to_pylist())


def test_with_exchange_every_rank_trains_rows_of_every_partition(runs: Runs) -> None:
    on, off = runs.home / "runs" / "on", runs.home / "runs" / "off"
    for rank in (0, 1):
        own = set(assigned_partitions(list(range(PARTITIONS)), rank, 2))
        assert _kafka_partitions(off, rank) == own  # without exchange: only its own partitions
        assert _kafka_partitions(on, rank) == set(range(PARTITIONS))  # with it: all of them
    s_on = json.loads((on / "metrics.json").read_text())
    s_off = json.loads((off / "metrics.json").read_text())
    assert s_on["exchange"] is True and s_on["exchanged_rows"] > 0
    assert s_off["exchange"] is False and s_off["exchanged_rows"] == 0
    # about half of the stream crossed to the other rank (the split is balanced)
    assert 0.3 < s_on["exchanged_rows"] / s_on["samples_kafka"] < 0.7


def test_with_exchange_the_stream_is_trained_exactly_once_and_offsets_are_final(runs: Runs) -> None:
    run_dir = runs.home / "runs" / "on"
    audit = read_audit(run_dir)
    assert_trained_once(audit, "kafka", runs.expected_stream)
    assert_trained_once(audit, "iceberg", training_ids(runs.fx, window_days=1))
    s = json.loads((run_dir / "metrics.json").read_text())
    assert s["samples_kafka"] == len(runs.expected_stream)
    assert s["kafka_lag_at_stop"] == 0 and s["stop_reason"].startswith("caught up")
    assert s["final_offsets"] == {str(p): o for p, o in end_offsets(runs.bootstrap, runs.topic).items()}
    # the committed checkpoint's offsets are the consuming ranks' positions: the final ones
    meta = checkpoint_meta(run_dir)
    assert meta is not None and {str(k): v for k, v in meta["positions"].items()} == s["final_offsets"]  # type: ignore[attr-defined]


def foreign_buffered_rows(run_dir: Path) -> int:
    """Rows in the latest checkpoint's shuffle buffers held by a rank that does not read their partition."""
    ckpt = run_dir / "checkpoint" / (run_dir / "checkpoint" / "latest").read_text().strip()
    foreign = 0
    for rank in (0, 1):
        try:
            state = decode_state(ckpt / f"data-rank-{rank}.npz")
        except (OSError, ValueError, EOFError):  # pruned by the live run while we read: look again
            return 0
        if state.get("shuffle"):
            parts = np.asarray(state["shuffle"]["rows"]["partition"])
            foreign += int((~np.isin(parts, assigned_partitions(list(range(PARTITIONS)), rank, 2))).sum())
    return foreign


def test_kill_in_the_stream_phase_with_exchange_then_resume(tmp_path: Path, kafka_bootstrap: str) -> None:

    fx = make_samples(tmp_path, days=1, per_day=2000, row_group_rows=500, stream_minutes=720.0)
    data = generated(tmp_path, fx)
    topic = f"exchange-resume-{tmp_path.name}"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    half = data.stream.num_rows // 2
    produce_samples(kafka_bootstrap, topic, data.stream.slice(0, half))
    cfg = train_config(fx, run_id="kx", bootstrap=kafka_bootstrap, topic=topic, dlq_topic=topic + ".dlq", window_days=1,
                       data={"batch_size": 64, "stream_shuffle_buffer": 200, "exchange": True,
                             "consume_batch": 50,  # small polls: the buffers stay full while the stream flows
                             "stop": {"mode": "duration", "duration_s": 120, "timeout_s": 150}},
                       run={"checkpoint_every_steps": 3, "checkpoint_every_s": 0.3})
    cfg_path = tmp_path / "train.json"
    cfg_path.write_text(json.dumps(cfg))
    run_dir = tmp_path / "runs" / "kx"

    # kill only once the committed checkpoint holds rows of a partition in a rank that does not read
    # it (they were exchanged): the resume must give them back to the partition's reader, once.
    # Waiting for that state (rather than hoping the kill lands in it) keeps the test off timing.
    killed = start_and_kill(tmp_path, cfg_path, run_dir,
                            lambda m: in_stream_with_progress(m) and foreign_buffered_rows(run_dir) > 0)
    assert killed["phase"] == "stream"
    foreign = foreign_buffered_rows(run_dir)
    produce_samples(kafka_bootstrap, topic, data.stream.slice(half))  # the stream went on meanwhile

    done = run_torchrun(tmp_path, cfg_path, nproc=2, overrides=("data.stop.mode=caught_up",))
    assert done.returncode == 0, done.stderr[-4000:]
    audit = read_audit(run_dir)
    assert_trained_once(audit, "iceberg", training_ids(fx, window_days=1))
    assert_trained_once(audit, "kafka", stream_ids(data.stream, fx.t_handoff))
    summary = json.loads((run_dir / "metrics.json").read_text())
    assert summary["kafka_lag_at_stop"] == 0 and summary["exchanged_rows"] > 0
    assert summary["final_offsets"] == {str(p): o for p, o in end_offsets(kafka_bootstrap, topic).items()}
    assert foreign > 0, "the kill found no exchanged rows buffered: the resume path was not exercised"
