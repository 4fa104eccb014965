"""SIGTERM to a running 2-process torchrun job: every rank stops after the same step, one checkpoint
holds that step, nothing trained is lost (the progress log has no step past it), the workers exit
with status 3, and running the job again resumes there and trains every sample exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from slipstream.pipeline.elastic import read_worlds
from tests.trainer_fixtures import (
    REPO,
    assert_trained_once,
    make_samples,
    run_torchrun,
    torchrun_command,
    train_config,
    trainer_env,
    training_ids,
)
from trainers.observe.sample_audit import read_audit

pytestmark = pytest.mark.integration


def test_sigterm_commits_the_last_step_and_the_run_resumes_there(tmp_path: Path) -> None:
    fx = make_samples(tmp_path, days=2, per_day=1500, row_group_rows=250)
    cfg = train_config(fx, run_id="gs", bootstrap="127.0.0.1:9", topic="unused", dlq_topic="unused.dlq",
                       data={"batch_size": 8, "epochs": 1, "validation_days": 0, "shuffle_buffer": 300, "stream": False},
                       run={"checkpoint_every_steps": 100_000, "checkpoint_every_s": 0, "log_every_steps": 1,
                            "tensorboard": False})
    cfg_path = tmp_path / "train.json"
    cfg_path.write_text(json.dumps(cfg))
    run_dir = tmp_path / "runs" / "gs"
    log = open(tmp_path / "stopped.log", "w")
    proc = subprocess.Popen(torchrun_command(cfg_path, 2), env=trainer_env(tmp_path), cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(_progress(run_dir)) < 20:
            assert proc.poll() is None, f"the run ended before the signal; see {log.name}"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # torchrun's agent passes it on to both workers
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert rc != 0
    stops = [e for e in read_worlds(run_dir) if e["event"] == "stop"]
    # torchrun signals its workers one after the other: one or both had the signal by the step they agreed on
    assert len(stops) == 1 and stops[0]["ranks"] in (1, 2) and stops[0]["world"] == 2, stops
    step = stops[0]["step"]
    ckpt = run_dir / "checkpoint"
    meta = json.loads((ckpt / (ckpt / "latest").read_text().strip() / "meta.json").read_text())
    assert meta["step"] == step and meta["run"]["phase"] == "batch"  # no periodic checkpoint: this is the stop's
    assert max(p["step"] for p in _progress(run_dir)) == step  # no step trained past the committed one
    assert (tmp_path / "stopped.log").read_text().count(f"stopped at step {step} on a signal to") == 2  # both ranks

    done = run_torchrun(tmp_path, cfg_path, nproc=2)
    assert done.returncode == 0, done.stderr[-4000:]
    starts = [e for e in read_worlds(run_dir) if e["event"] == "start"]
    assert [s["step"] for s in starts] == [0, step] and starts[1]["resumed"]
    assert_trained_once(read_audit(run_dir), "iceberg", training_ids(fx, validation_days=0), per_epoch=True)


def _progress(run_dir: Path) -> list[dict[str, object]]:
    try:
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []

