"""`slipstream stack down` while a producer of the stack writes: the producer is stopped (and
flushes) before the broker, the broker stops once it has written what it acknowledged, and a
restarted broker holds every acknowledged record."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from slipstream.dev import stack
from slipstream.processes import stop_process
from slipstream.settings import Settings
from slipstream.stream.kafka import consumer_config, create_topic

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _read_all(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, int], str]:
    c = Consumer(consumer_config(bootstrap, group="after-restart"))
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in range(partitions)}
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[tuple[int, int], str] = {}
        deadline = time.monotonic() + 60
        while any(c.position([TopicPartition(topic, p)])[0].offset < e for p, e in ends.items() if e):
            assert time.monotonic() < deadline, "the restarted broker did not hand over its records"
            for m in c.consume(10_000, timeout=0.5):
                if m.error() is None:
                    out[(m.partition(), m.offset())] = m.value().decode()
        return out
    finally:
        c.close()


def test_stack_down_stops_a_writing_producer_first_and_every_acknowledged_record_survives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = stack.free_port()
    monkeypatch.setenv("SLIPSTREAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLIPSTREAM_KAFKA_PORT", str(port))
    settings = Settings.from_env()
    state = stack.up(settings, airflow=False)
    bootstrap = state.services["kafka"].address
    create_topic(bootstrap, "writes", 2)
    ack_log = tmp_path / "acks.txt"
    writer = subprocess.Popen([sys.executable, str(REPO / "tests" / "stack_writer.py"), str(settings.home), bootstrap,
                               "writes", str(ack_log)], env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}"},
                              start_new_session=True)
    restarted = None
    try:
        deadline = time.monotonic() + 60
        while not ack_log.exists() or ack_log.read_text().count("\n") < 2000:
            assert writer.poll() is None and time.monotonic() < deadline, "the writer did not get going"
            time.sleep(0.1)
        assert writer.poll() is None  # still writing when `stack down` starts
        stopped = stack.down(settings)
        assert stopped == [f"producer test-writer (pid {writer.pid})", f"kafka (pid {state.services['kafka'].pid})"]
        assert writer.poll() == 0  # it had exited (flushed) before the broker was stopped
        lines = ack_log.read_text().splitlines()
        assert lines[-1] == "# stopped, 0 not acknowledged"
        acked = {(int(p), int(o)): v for p, o, v in (line.split() for line in lines[:-1])}
        restarted = stack.start_kafka(settings.home, port)
        held = _read_all(restarted.address, "writes", 2)
        missing = sorted(k for k, v in acked.items() if held.get(k) != v)
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged records lost, e.g. {missing[:5]}"
        assert len(acked) >= 2000
    finally:
        if writer.poll() is None:
            stop_process(writer.pid)
        if restarted is not None:
            stop_process(restarted.pid)
        stack.down(settings)
