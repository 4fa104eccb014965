"""A tidal schedule on real launchers (`slipstream elastic`, torch's elastic agent, c10d on loopback):
one job trains on 1 process, grows to 3 (two launchers join), loses one (SIGTERM: a graceful
leave) and then another (SIGKILL of its launcher and workers: a node that dies), and finishes.

What must hold, read from what the run committed: every sample trained exactly once per epoch
(the audit against the table and the topic), no step lost on a graceful change (the next world
resumes at the step the old one stopped at), a hard kill costs only the steps since the last
checkpoint (the progress log shows what the dead world trained past it), and the exported model
equals a fresh read of the final checkpoint. In the batch phase (the epoch's remaining chunks
re-dealt over each new world) with data parallelism, and in the stream phase (Kafka partitions
and buffered rows re-dealt) with the tables sharded by TorchRec (its DCP checkpoint read by each
new world).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pytest
import torch

from bench.support.elastic_run import ElasticRun
from slipstream.stream.kafka import create_topic, produce_samples
from tests.trainer_fixtures import (
    REPO,
    assert_trained_once,
    generated,
    make_samples,
    stream_ids,
    train_config,
    trainer_env,
    training_ids,
)
from trainers.checkpoint.store import Checkpointer
from trainers.observe.sample_audit import read_audit

pytestmark = pytest.mark.integration

CHECKPOINT_EVERY = 5


def _progress(run_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_path / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _exported_equals_checkpoint(run_path: Path) -> None:
    """Every tensor of export/model.pt equals the model of the last checkpoint, read afresh in this
    process (a sharded checkpoint's tables gathered from every rank's DCP files)."""
    exported = torch.load(run_path / "export" / "model.pt", map_location="cpu", weights_only=True)["state_dict"]
    latest = Checkpointer(run_path / "checkpoint", 0, lambda: None).latest()
    assert latest is not None
    saved = Checkpointer.load_model(latest)["model"]["model"]
    for key, tensor in exported.items():
        match = [k for k in saved if k == key or k.endswith("." + key)]
        assert len(match) == 1, f"{key}: {match or 'not in the checkpoint'}"
        value = saved[match[0]]
        if hasattr(value, "local_shards"):  # never on a fresh read: load_model returns whole tensors
            raise AssertionError(f"{key} read back sharded")
        assert torch.equal(tensor, value), f"{key} differs between the export and {latest.name}"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _worlds(run: ElasticRun) -> tuple[list[int], list[dict[str, Any]], list[dict[str, Any]]]:
    events = run.worlds()
    return ([e["world"] for e in events if e["event"] == "start"], [e for e in events if e["event"] == "start"],
            [e for e in events if e["event"] == "stop"])


def _world(run: ElasticRun, size: int, after: float, feed: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    """Wait for a world of `size` started after `after`, feed it (the stream variant produces the
    next slice of the topic only now, so the new world has rows of its own to train), and return
    its first step."""
    start = run.wait_for(lambda: next((e for e in run.worlds() if e["event"] == "start" and e["world"] == size
                                       and e["time"] >= after), None), f"a world of {size} to start", 300)
    if feed is not None:
        feed(start)
    return run.wait_world(size, after)


def _tidal(run: ElasticRun, *, before_growing: Callable[[], None] | None = None,
           feed: Callable[[dict[str, Any]], None] | None = None, leave_by_command: bool = False,
           kill_tree: bool = True) -> dict[str, Any]:
    """1 -> 3 -> 2 (SIGTERM) -> 1 (SIGKILL). `kill_tree`: the launcher and its workers die at once
    (a machine lost), else the launcher alone (its agent OOM-killed): its workers must not train on
    unsupervised."""
    joined = run.join_standby(2)
    run.wait_loaded(3)
    _world(run, 1, run.activate(0), feed)
    if before_growing is not None:
        before_growing()
    _world(run, 3, run.activate(), feed)
    if leave_by_command:  # `slipstream elastic leave`, as a person types it
        left_at = time.time()
        assert json.loads(run.cli("elastic", "leave", run.run_path.name, "--launcher", str(joined[0])))["left"] == joined[0]
    else:
        left_at = run.leave(joined[0])
    world2 = _world(run, 2, left_at, feed)
    # a checkpoint of the world of 2 past its first step, so that the kill has committed progress to keep
    run.wait_for(lambda: (m := run.checkpoint_meta()) and m["world"] == 2 and m["step"] > world2["step"],
                 "a checkpoint of the world of 2", 300)
    killed_at, orphans = run.kill(joined[1], tree=kill_tree)
    if not kill_tree:  # its workers see their launcher gone and end themselves
        run.wait_for(lambda: not any(_running(pid) for pid in orphans), "the dead launcher's workers to end", 60)
    committed = run.checkpoint_meta()  # nothing commits once a rank is dead
    assert committed is not None
    _world(run, 1, killed_at, feed)
    return {"committed_at_kill": int(committed["step"]), "joined": joined}


def _check_schedule(run: ElasticRun, run_path: Path, committed_at_kill: int) -> None:
    sizes, starts, stops = _worlds(run)
    assert sizes[0] == 1 and max(sizes) == 3 and sizes[-2:] == [2, 1], sizes
    # graceful changes (the joins, the SIGTERM) lose no step: the next world starts where the old stopped
    for stop in stops:
        nxt = next(s for s in starts if s["time"] > stop["time"])
        assert nxt["step"] == stop["step"], (stop, nxt)
    assert len(stops) >= 2 and all(s["ranks"] >= 1 for s in stops)
    # the kill: the last world resumed from the last checkpoint committed before it, and the dead
    # world's progress log shows it lost at most the steps since that checkpoint
    assert starts[-1]["step"] == committed_at_kill
    trained_by_two = max(p["step"] for p in _progress(run_path) if p.get("world") == 2)
    assert 0 <= trained_by_two - committed_at_kill <= CHECKPOINT_EVERY, (trained_by_two, committed_at_kill)


@pytest.fixture
def elastic_run(tmp_path: Path):  # type: ignore[no-untyped-def]
    env = {**trainer_env(tmp_path), "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}"}
    run = ElasticRun(tmp_path / "runs" / "tide", env, REPO, tmp_path / "launchers")
    yield run
    run.close()


def test_tidal_schedule_in_the_batch_phase_data_parallel(tmp_path: Path, elastic_run: ElasticRun) -> None:
    fx = make_samples(tmp_path, days=2, per_day=1600, row_group_rows=200)
    cfg = train_config(fx, run_id="tide", bootstrap="127.0.0.1:9", topic="unused", dlq_topic="unused.dlq",
                       data={"batch_size": 8, "epochs": 2, "validation_days": 0, "shuffle_buffer": 400, "stream": False},
                       run={"checkpoint_every_steps": CHECKPOINT_EVERY, "checkpoint_every_s": 0, "log_every_steps": 1,
                            "tensorboard": False})
    (tmp_path / "train.json").write_text(json.dumps(cfg))
    run_path = elastic_run.run_path
    elastic_run.start(["--config", str(tmp_path / "train.json")], max_nodes=3)
    schedule = _tidal(elastic_run, leave_by_command=True, kill_tree=False)
    assert elastic_run.wait(600) == 0, f"see {elastic_run.log_dir}"

    _check_schedule(elastic_run, run_path, schedule["committed_at_kill"])
    assert all(s["phase"] == "batch" for s in _worlds(elastic_run)[1])
    audit = read_audit(run_path)
    assert_trained_once(audit, "iceberg", training_ids(fx, validation_days=0), per_epoch=True)
    assert set(audit.column("epoch").to_pylist()) == {0, 1}
    _exported_equals_checkpoint(run_path)
    summary = json.loads((run_path / "metrics.json").read_text())
    assert summary["world_size"] == 1 and summary["samples_iceberg"] == 2 * len(training_ids(fx, validation_days=0))
    status = json.loads(elastic_run.cli("elastic", "status", "tide", "--json"))
    ended = {la["index"]: la["exit_code"] for la in status["launchers"]}
    assert ended[0] == 0 and ended[schedule["joined"][0]] == 128 + 15 and ended[schedule["joined"][1]] is None
    assert not any(la["running"] for la in status["launchers"])


def test_tidal_schedule_in_the_stream_phase_sharded(tmp_path: Path, kafka_bootstrap: str, elastic_run: ElasticRun) -> None:
    fx = make_samples(tmp_path, days=1, per_day=600, row_group_rows=200, stream_minutes=4320.0)  # ~1,800 stream rows
    data = generated(tmp_path, fx)
    topic = f"tide-{tmp_path.name}"
    create_topic(kafka_bootstrap, topic, 4)
    expected = stream_ids(data.stream, fx.t_handoff)
    cut = [data.stream.num_rows * k // 4 for k in range(5)]
    slices: list[pa.Table] = [data.stream.slice(a, b - a) for a, b in zip(cut, cut[1:])]
    produce_samples(kafka_bootstrap, topic, slices[0])
    cfg = train_config(fx, run_id="tide", bootstrap=kafka_bootstrap, topic=topic, dlq_topic=topic + ".dlq", window_days=1,
                       data={"batch_size": 16, "stream_shuffle_buffer": 64,
                             "stop": {"mode": "samples", "samples": len(expected), "timeout_s": 600}},
                       run={"checkpoint_every_steps": CHECKPOINT_EVERY, "checkpoint_every_s": 0, "log_every_steps": 1,
                            "tensorboard": False},
                       model={"sharding": "auto"}, optim={"table_optimizer": "adagrad", "table_lr": 0.05})
    (tmp_path / "train.json").write_text(json.dumps(cfg))
    run_path = elastic_run.run_path
    elastic_run.start(["--config", str(tmp_path / "train.json")], max_nodes=3)

    def in_stream() -> None:  # grow once the stream phase has trained some of the topic
        elastic_run.wait_for(lambda: (m := elastic_run.checkpoint_meta()) and m["run"]["phase"] == "stream"
                             and m["run"]["counters"]["samples_kafka"] > 0, "a stream-phase checkpoint", 300)

    fed = iter(slices[1:])

    def feed(start: dict[str, Any]) -> None:  # each world after the first gets the next quarter of the stream
        if start["resumed"]:
            produce_samples(kafka_bootstrap, topic, next(fed))

    schedule = _tidal(elastic_run, before_growing=in_stream, feed=feed)
    assert elastic_run.wait(600) == 0, f"see {elastic_run.log_dir}"

    _check_schedule(elastic_run, run_path, schedule["committed_at_kill"])
    assert [s["phase"] for s in _worlds(elastic_run)[1]][1:] == ["stream"] * 3
    audit = read_audit(run_path)
    assert_trained_once(audit, "kafka", expected)
    assert_trained_once(audit, "iceberg", training_ids(fx, window_days=1))
    _exported_equals_checkpoint(run_path)
    summary = json.loads((run_path / "metrics.json").read_text())
    assert summary["world_size"] == 1 and summary["samples_kafka"] == len(expected)
    # every rank of the world of 3 committed trained rows (it read its own share of the 4 partitions)
    ranks = {int(p.name.split("-")[1]) for p in (run_path / "audit" / "parts").glob("rank-*-step-*.parquet")}
    assert ranks == {0, 1, 2}
