"""Multi-node training on loopback: two torchrun launchers (`--nnodes 2`, c10d rendezvous on
127.0.0.1) run one job; killed with SIGKILL in the middle of a batch epoch, the run resumes on 1
and on 3 processes (what every old rank had left of the epoch is re-dealt) and the audit shows
every sample trained once: 0 lost, 0 duplicated. The topic's 2 partitions are more than 1 rank
and fewer than 3, so the stream phase deals them both ways; on 3, `data.exchange` spreads the
fresh rows to the rank that reads no partition."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slipstream.stream.kafka import create_topic, produce_samples
from tests.trainer_fixtures import (
    REPO,
    assert_trained_once,
    checkpoint_meta,
    free_port,
    generated,
    kill_run,
    make_samples,
    run_torchrun,
    stream_ids,
    train_config,
    trainer_env,
    training_ids,
)
from trainers.observe.sample_audit import read_audit

pytestmark = pytest.mark.integration


def node_command(cfg_path: Path, port: int, job: str) -> list[str]:
    """One of two torchrun launchers of one job: one process each, rendezvous on 127.0.0.1."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job,
            "--local-addr", "127.0.0.1", "-m", "trainers.train", "--config", str(cfg_path)]


def start_two_nodes_and_kill(home: Path, cfg_path: Path, run_dir: Path, timeout_s: float = 180) -> dict[str, object]:
    """Start both launchers, SIGKILL both once a checkpoint is in the middle of batch epoch 0."""
    port = free_port()
    env = {**trainer_env(home), "GLOO_SOCKET_IFNAME": "lo"}
    logs = [open(home / f"node-{i}.log", "w") for i in range(2)]
    nodes = [subprocess.Popen(node_command(cfg_path, port, "mn"), env=env, cwd=REPO, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True) for log in logs]
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            meta = checkpoint_meta(run_dir)
            if meta is not None and meta["phase"] == "batch" and int(meta["step"]) >= 12:  # type: ignore[call-overload]
                for n in nodes:
                    kill_run(n)
                after = checkpoint_meta(run_dir)
                assert after is not None
                return after
            ended = [n.returncode for n in nodes if n.poll() is not None]
            if ended:
                raise AssertionError(f"a node ended (rc {ended}) before the kill; see {home}/node-*.log")
            time.sleep(0.01)
        raise AssertionError(f"no mid-epoch checkpoint within {timeout_s}s; see {home}/node-*.log")
    finally:
        for n in nodes:
            if n.poll() is None:
                kill_run(n)
        for log in logs:
            log.close()


def test_two_nodes_killed_mid_epoch_resume_on_one_and_on_three(tmp_path: Path, kafka_bootstrap: str) -> None:
    fx = make_samples(tmp_path, days=2, per_day=1500, row_group_rows=250, stream_minutes=60.0)
    data = generated(tmp_path, fx)
    topic = f"multinode-{tmp_path.name}"
    create_topic(kafka_bootstrap, topic, 2)
    produce_samples(kafka_bootstrap, topic, data.stream)
    cfg = train_config(fx, run_id="mn", bootstrap=kafka_bootstrap, topic=topic, dlq_topic=topic + ".dlq",
                       data={"batch_size": 32, "epochs": 1, "shuffle_buffer": 500, "validation_days": 0},
                       run={"checkpoint_every_steps": 4, "checkpoint_every_s": 0})
    cfg_path = tmp_path / "train.json"
    cfg_path.write_text(json.dumps(cfg))
    run_dir = tmp_path / "runs" / "mn"

    killed = start_two_nodes_and_kill(tmp_path, cfg_path, run_dir)
    assert killed["world"] == 2 and killed["phase"] == "batch" and killed["epoch"] == 0
    shutil.copytree(run_dir, tmp_path / "runs" / "mn3", symlinks=True)

    expected_batch, expected_stream = training_ids(fx, validation_days=0), stream_ids(data.stream, fx.t_handoff)
    for run_id, nproc, exchange in (("mn", 1, False), ("mn3", 3, True)):
        overrides = (f"run.run_id={run_id}", f"data.exchange={str(exchange).lower()}")
        done = run_torchrun(tmp_path, cfg_path, nproc=nproc, overrides=overrides, timeout_s=300)
        assert done.returncode == 0, f"resume on {nproc}: " + done.stderr[-4000:]
        out = tmp_path / "runs" / run_id
        audit = read_audit(out)
        assert_trained_once(audit, "iceberg", expected_batch)
        assert_trained_once(audit, "kafka", expected_stream)
        summary = json.loads((out / "metrics.json").read_text())
        assert summary["world_size"] == nproc and summary["kafka_lag_at_stop"] == 0
        assert sorted(summary["handoff_offsets"]) == ["0", "1"]
        if exchange:  # rank 2 reads no partition of its own: the all-to-all gives it fresh rows
            assert summary["exchanged_rows"] > 0
