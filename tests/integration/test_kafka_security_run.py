"""Kafka security settings reach every client of a real run (issue 23, item 11).

noida-db, the embedded broker, has no authentication of its own: it accepts SASL/PLAIN with any
password and cannot complete a SCRAM exchange. So the tests show (1) every client Slipstream
makes carries the SASL settings and works over SASL_PLAINTEXT, and (2) a broker that refuses the
login (SCRAM here) stops a real trainer with a message naming the broker, the mechanism and the
user, and never the password. A wrong password against an authenticating broker goes through
the same error callback (`slipstream.stream.kafka.KafkaAuthError`).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from slipstream.stream import handoff, kafka
from slipstream.stream.kafka import KafkaAccess
from tests.trainer_fixtures import generated, make_samples, run_torchrun, train_config
from trainers.data import kafka_source

pytestmark = pytest.mark.integration


def test_every_client_of_the_stream_path_uses_the_security_settings(tmp_path: Path, kafka_bootstrap: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from slipstream.quality.audit import read_kafka_range

    made: list[tuple[str, dict[str, Any]]] = []

    def recording(cls: Any) -> Any:
        def make(cfg: dict[str, Any], *a: Any, **kw: Any) -> Any:
            made.append((cls.__name__, dict(cfg)))
            return cls(cfg, *a, **kw)
        return make

    for module in (kafka, handoff, kafka_source, confluent_kafka):
        for name in ("Consumer", "Producer", "AdminClient"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, recording(getattr(module, name)))
    access = KafkaAccess(kafka_bootstrap, "SASL_PLAINTEXT", "PLAIN", "trainer", "s3cret")
    fx = make_samples(tmp_path, days=1, per_day=300, stream_minutes=120.0)
    stream = generated(tmp_path, fx).stream
    topic = f"secure-{tmp_path.name}"
    kafka.wait_for_broker(access)
    kafka.create_topic(access, topic, 2)
    kafka.produce_samples(access, topic, stream)
    ends = kafka.end_offsets(access, topic)
    plan = handoff.find_handoff(access, topic, fx.t_handoff, timedelta(seconds=fx.gen.max_lateness_s))
    assert kafka_source.topic_partitions(access, topic) == sorted(ends)
    src = kafka_source.KafkaSource(bootstrap=access, topic=topic, dlq_topic=topic + ".dlq", partitions=sorted(ends),
                                   positions=plan.offsets, t_handoff_us=0, consume_batch=1000, consume_timeout_s=0.5,
                                   lag_interval_s=60, group="secure")
    src._dead_letter(b"{bad", None, "test", 0, 0)  # the dead-letter producer too
    for _ in range(200):
        if not src.lag(refresh=True):
            break
        src.poll()
    src.close()
    assert kafka_source.read_range(access, topic, {p: (0, e) for p, e in ends.items()}, "secure-eval")
    assert read_kafka_range(access, topic, {p: 0 for p in ends}, ends).num_rows == stream.num_rows
    kinds = {kind for kind, _ in made}
    assert kinds == {"Consumer", "Producer", "AdminClient"}, kinds
    for kind, cfg in made:
        assert cfg["security.protocol"] == "SASL_PLAINTEXT" and cfg["sasl.mechanism"] == "PLAIN", (kind, cfg)
        assert cfg["sasl.username"] == "trainer" and cfg["sasl.password"] == "s3cret", (kind, cfg)


def test_a_refused_login_stops_the_trainer_naming_broker_and_mechanism(tmp_path: Path, kafka_bootstrap: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fx = make_samples(tmp_path, days=1, per_day=400, row_group_rows=400, stream_minutes=60.0)
    generated(tmp_path, fx)
    topic = f"refused-{tmp_path.name}"
    kafka.create_topic(kafka_bootstrap, topic, 2)
    cfg = train_config(fx, run_id="refused", bootstrap=kafka_bootstrap, topic=topic, dlq_topic=topic + ".dlq", window_days=1)
    path = tmp_path / "train.json"
    path.write_text(json.dumps(cfg))
    for name, value in {"SLIPSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "SLIPSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
                        "SLIPSTREAM_KAFKA_SASL_USERNAME": "trainer", "SLIPSTREAM_KAFKA_SASL_PASSWORD": "wrong-pa55"}.items():
        monkeypatch.setenv(name, value)
    out = run_torchrun(tmp_path, path, nproc=1)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert f"{kafka_bootstrap} (SCRAM-SHA-256 as 'trainer' over SASL_PLAINTEXT)" in text, text[-3000:]
    assert "refused the connection" in text and "wrong-pa55" not in text
