"""A broker that comes back with fewer records than the trainer has read stops the trainer with a
message naming topic, partition and offsets, instead of skipping the new records that reuse the
lost offsets (issue 23, item 2).

The loss is real: the broker is stopped and started again on an empty data dir at the same port
(what a noida-db killed with -9 right after writes does to its last seconds of records, made
deterministic).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from slipstream.errors import StreamDataLost
from slipstream.stream.kafka import create_topic, produce_samples
from tests.trainer_fixtures import (
    REPO,
    Broker,
    checkpoint_meta,
    free_port,
    generated,
    kill_run,
    make_samples,
    torchrun_command,
    train_config,
    trainer_env,
)
from trainers.data.kafka_source import KafkaSource

pytestmark = pytest.mark.integration


def _fresh_broker(tmp_path: Path, port: int, name: str) -> Broker:
    broker = Broker(tmp_path / name, port)
    broker.start()
    return broker


def _source(bootstrap: str, topic: str, positions: dict[int, int]) -> KafkaSource:
    return KafkaSource(bootstrap=bootstrap, topic=topic, dlq_topic=topic + ".dlq", partitions=sorted(positions),
                       positions=positions, t_handoff_us=0, consume_batch=1000, consume_timeout_s=0.5,
                       lag_interval_s=60.0, group="loss-test")


def test_a_source_refuses_a_broker_that_lost_what_it_read(tmp_path: Path) -> None:
    fx = make_samples(tmp_path, days=1, per_day=400, stream_minutes=600.0)
    data = generated(tmp_path, fx)
    n = data.stream.num_rows
    assert n > 60
    port = free_port()
    broker = _fresh_broker(tmp_path, port, "before")
    try:
        create_topic(broker.bootstrap, "s", 1)
        produce_samples(broker.bootstrap, "s", data.stream.slice(0, n - 20))
        src = _source(broker.bootstrap, "s", {0: 0})
        deadline = time.monotonic() + 30
        while src.positions[0] < n - 20 and time.monotonic() < deadline:
            src.poll()
        assert src.positions[0] == n - 20
        broker.stop()
        broker = _fresh_broker(tmp_path, port, "after")  # the same address, the records gone
        create_topic(broker.bootstrap, "s", 1)
        produce_samples(broker.bootstrap, "s", data.stream.slice(n - 20))  # reuses offsets 0..19
        with pytest.raises(StreamDataLost) as e:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                src.poll()
                src.lag(refresh=src.idle)
        assert f"s[0] on {broker.bootstrap}" in str(e.value) and f"next offset is {n - 20}" in str(e.value)
        src.close()
        # and a resume from the checkpointed position is refused before it reads anything
        with pytest.raises(StreamDataLost, match=rf"s\[0\].*next offset is {n - 20} but its high watermark is 20"):
            _source(broker.bootstrap, "s", {0: n - 20})
    finally:
        broker.stop()


def test_the_trainer_stops_naming_the_partition(tmp_path: Path) -> None:
    fx = make_samples(tmp_path, days=1, per_day=800, row_group_rows=400, stream_minutes=120.0)
    data = generated(tmp_path, fx)
    port = free_port()
    broker = _fresh_broker(tmp_path, port, "before")
    try:
        topic = "loss"
        create_topic(broker.bootstrap, topic, 2)
        produce_samples(broker.bootstrap, topic, data.stream)
        cfg = train_config(fx, run_id="loss", bootstrap=broker.bootstrap, topic=topic, dlq_topic=topic + ".dlq",
                           window_days=1, data={"batch_size": 64, "stop": {"mode": "duration", "duration_s": 600,
                                                                            "timeout_s": 600}},
                           run={"checkpoint_every_steps": 5, "checkpoint_every_s": 0.3})
        cfg_path = tmp_path / "train.json"
        cfg_path.write_text(json.dumps(cfg))
        run_dir = tmp_path / "runs" / "loss"
        with open(tmp_path / "run.log", "w") as log:
            proc = subprocess.Popen(torchrun_command(cfg_path, 2), env=trainer_env(tmp_path), cwd=REPO, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                deadline = time.monotonic() + 180
                while True:  # caught up: every record read
                    m = checkpoint_meta(run_dir)
                    if m and m["phase"] == "stream" and sum(m["positions"].values()) == data.stream.num_rows:  # type: ignore[union-attr]
                        break
                    assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()[-3000:]
                    time.sleep(0.1)
                broker.stop()
                broker = _fresh_broker(tmp_path, port, "after")
                create_topic(broker.bootstrap, topic, 2)
                produce_samples(broker.bootstrap, topic, data.stream.slice(0, 40))
                rc = proc.wait(120)
            finally:
                if proc.poll() is None:
                    kill_run(proc)
        out = (tmp_path / "run.log").read_text()
        assert rc != 0, out[-3000:]
        assert "StreamDataLost" in out or "lost records this run already read" in out
        assert f"{topic}[0]" in out or f"{topic}[1]" in out, out[-3000:]
        # each rank says one line: its own error, or that it stopped because another rank failed
        said = [line for line in out.splitlines() if line.startswith("trainers.train: rank ")]
        assert sorted(line[:len("trainers.train: rank 0")] for line in said) == ["trainers.train: rank 0",
                                                                                 "trainers.train: rank 1"], out[-3000:]
        assert all("lost records this run already read" in line or "stopped because rank" in line for line in said), said
        assert "Connection closed" not in out and "ProcessGroupGloo" not in out, out[-3000:]
    finally:
        broker.stop()
