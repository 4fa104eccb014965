"""The local stack starts and stops by PID; generated samples go through a real broker intact."""

from __future__ import annotations

import json
from datetime import date

import pytest
from confluent_kafka import Consumer, TopicPartition

from slipstream.dev import stack
from slipstream.dev.datagen import GeneratorConfig, generate
from slipstream.samples.codec import decode_samples
from slipstream.settings import Settings
from slipstream.stream.kafka import consumer_config, end_offsets, produce_samples

pytestmark = pytest.mark.integration


def test_stack_up_status_down(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    port = stack.free_port()
    monkeypatch.setenv("SLIPSTREAM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SLIPSTREAM_KAFKA_PORT", str(port))
    settings = Settings.from_env()
    state = stack.up(settings, airflow=False)
    pid = state.services["kafka"].pid
    try:
        st = stack.status(settings)
        assert st["kafka"]["running"] and st["kafka"]["address"] == f"127.0.0.1:{port}"
        assert set(end_offsets(f"127.0.0.1:{port}", settings.topic)) == {0, 1, 2, 3}
        assert (settings.home / "catalog.db").exists()
        # a second `up` reuses the running broker instead of starting another
        assert stack.up(settings, airflow=False).services["kafka"].pid == pid
    finally:
        stopped = stack.down(settings)
    assert stopped == [f"kafka (pid {pid})"]
    assert not stack.pid_alive(pid)
    assert not stack.port_open("127.0.0.1", port)


def test_generated_stream_round_trips_through_the_broker(kafka_bootstrap: str, topic: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=4_000, stream_minutes=60)
    data = generate(cfg, tmp_path / "raw")
    n = produce_samples(kafka_bootstrap, topic, data.stream)
    assert n == data.stream.num_rows > 0
    ends = end_offsets(kafka_bootstrap, topic)
    assert sum(ends.values()) == n

    c = Consumer(consumer_config(kafka_bootstrap))
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    values, ts = [], []
    while len(values) < n:
        for m in c.consume(1000, timeout=5):
            assert m.error() is None
            values.append(m.value())
            ts.append(m.timestamp()[1])
    c.close()
    out = decode_samples(values)
    assert out.bad == []
    assert sorted(out.table.column("sample_id").to_pylist()) == sorted(data.stream.column("sample_id").to_pylist())
    # the record timestamp is the event time (ms): the handoff relies on it
    ev = [t.timestamp() * 1000 for t in out.table.column("event_time").to_pylist()]
    assert all(abs(a - b) < 1.0 for a, b in zip(ev, ts))


def test_the_stack_port_reaches_every_later_command(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`SLIPSTREAM_KAFKA_PORT=N slipstream stack up`, then a plain `slipstream generate` (the port no
    longer in its environment) writes to the broker on N: the stack's settings file is the one
    source of the address, never a default that may be another user's broker."""
    import os
    import subprocess
    import sys

    port = stack.free_port()
    home = tmp_path / "home"
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLIPSTREAM_")}
    base["SLIPSTREAM_HOME"] = str(home)
    cli = [sys.executable, "-m", "slipstream.cli"]
    subprocess.run([*cli, "stack", "up", "--no-airflow"], env={**base, "SLIPSTREAM_KAFKA_PORT": str(port)},
                   check=True, capture_output=True, timeout=120)
    try:
        assert oct((home / "settings.env").stat().st_mode & 0o777) == "0o600"
        settings = Settings.from_env(base)
        assert settings.kafka_bootstrap == f"127.0.0.1:{port}"
        assert settings.topic == "synthetic.samples"  # the default data set's own sample topic
        out = subprocess.run([*cli, "generate", "--days", "1", "--impressions-per-day", "500", "--stream-minutes", "30",
                              "--stream-as", "samples"],  # finished samples to the sample topic (default: raw events)
                             env=base, check=True, capture_output=True, text=True, timeout=180)
        produced = json.loads(out.stdout)["produced"]
        assert produced > 0
        assert sum(end_offsets(f"127.0.0.1:{port}", settings.topic).values()) == produced
    finally:
        subprocess.run([*cli, "stack", "down"], env=base, check=True, capture_output=True, timeout=60)
    assert not (home / "settings.env").exists()
    assert not stack.port_open("127.0.0.1", port)
