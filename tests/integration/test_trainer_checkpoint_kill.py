"""kill -9 a real 2-process torchrun run in the middle of re-committing a checkpoint step, then
resume it: every sample trained exactly once (issue 23, item 1).

The handoff commits the batch phase's last step a second time (phase `stream`, the handoff
offsets). The trainer is paused at a chosen moment of that re-commit (`tests.checkpoint_pause_train`)
and the whole process group is killed with SIGKILL there: after the complete new folder exists
but before `latest` names it, and after `latest` names it but before the old folder is gone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slipstream.stream.kafka import create_topic, produce_samples
from tests.trainer_fixtures import (
    REPO,
    assert_trained_once,
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


@pytest.mark.parametrize("pause_at", ["_point_latest", "_prune"])
def test_kill_during_a_checkpoint_re_commit_then_resume(tmp_path: Path, kafka_bootstrap: str, pause_at: str) -> None:
    fx = make_samples(tmp_path, days=1, per_day=1500, row_group_rows=500, stream_minutes=120.0)
    data = generated(tmp_path, fx)
    topic = f"recommit-{pause_at.strip('_')}-{tmp_path.name}"
    create_topic(kafka_bootstrap, topic, 2)
    produce_samples(kafka_bootstrap, topic, data.stream)
    cfg = train_config(fx, run_id="rc", bootstrap=kafka_bootstrap, topic=topic, dlq_topic=topic + ".dlq", window_days=1,
                       data={"batch_size": 64}, run={"checkpoint_every_steps": 5, "checkpoint_every_s": 0})
    cfg_path = tmp_path / "train.json"
    cfg_path.write_text(json.dumps(cfg))
    ckpt = tmp_path / "runs" / "rc" / "checkpoint"

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "tests.checkpoint_pause_train", "--config", str(cfg_path)]
    with open(tmp_path / "paused-run.log", "w") as log:
        proc = subprocess.Popen(cmd, env={**trainer_env(tmp_path), "PAUSE_AT": pause_at}, cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while not (ckpt / "paused").exists():
                assert proc.poll() is None, (tmp_path / "paused-run.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the run never re-committed a step"
                time.sleep(0.05)
        finally:
            kill_run(proc)  # SIGKILL to the launcher and both workers
    committed = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-"))
    assert any(".r1" in name for name in committed), committed  # the re-commit's folder was written
    (ckpt / "paused").unlink()

    done = run_torchrun(tmp_path, cfg_path, nproc=2)
    assert done.returncode == 0, done.stderr[-4000:]
    audit = read_audit(tmp_path / "runs" / "rc")
    assert_trained_once(audit, "iceberg", training_ids(fx, window_days=1))
    assert_trained_once(audit, "kafka", stream_ids(data.stream, fx.t_handoff))
    summary = json.loads((tmp_path / "runs" / "rc" / "metrics.json").read_text())
    assert summary["samples_kafka"] == len(stream_ids(data.stream, fx.t_handoff))
