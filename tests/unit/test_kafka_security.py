"""One client configuration for every Kafka client, with TLS and SASL from the settings; the
password stays out of reprs, logs and children's settings (issue 23, item 11)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from slipstream.errors import ConfigError
from slipstream.settings import Settings
from slipstream.stream.kafka import KafkaAccess, client_config, consumer_config

REPO = Path(__file__).resolve().parents[2]
SECURE = {"SLIPSTREAM_KAFKA_BOOTSTRAP": "kafka-1:9093", "SLIPSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
          "SLIPSTREAM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "SLIPSTREAM_KAFKA_SASL_USERNAME": "trainer",
          "SLIPSTREAM_KAFKA_SASL_PASSWORD": "pa55-w0rd", "SLIPSTREAM_KAFKA_SSL_CA_LOCATION": "/etc/kafka/ca.pem"}


def test_every_kafka_client_is_configured_by_client_config() -> None:
    """Each Consumer, Producer and AdminClient the code makes takes its configuration from
    client_config/consumer_config: a client that builds its own dict would skip TLS and SASL."""
    own = []
    for folder in ("slipstream", "trainers", "bench", "plugins", "spark_jobs"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in (
                        "Consumer", "Producer", "AdminClient"):
                    arg = node.args[0] if node.args else None
                    name = getattr(getattr(arg, "func", None), "id", "") if isinstance(arg, ast.Call) else ""
                    if name not in ("client_config", "consumer_config"):
                        own.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not own, f"Kafka clients configured without client_config: {own}"


def test_settings_reach_the_client_configuration(tmp_path: Path) -> None:
    settings = Settings.from_env({"SLIPSTREAM_HOME": str(tmp_path), **SECURE})
    access = KafkaAccess.from_settings(settings)
    for cfg in (client_config(access), consumer_config(access, group="g"), client_config(access, **{"linger.ms": 5})):
        assert cfg["bootstrap.servers"] == "kafka-1:9093" and cfg["security.protocol"] == "SASL_SSL"
        assert cfg["sasl.mechanism"] == "SCRAM-SHA-512" and cfg["sasl.username"] == "trainer"
        assert cfg["sasl.password"] == "pa55-w0rd" and cfg["ssl.ca.location"] == "/etc/kafka/ca.pem"
    # a run's own data.bootstrap keeps the deployment's security
    assert client_config(KafkaAccess.from_settings(settings, "other:9093"))["sasl.username"] == "trainer"
    # the password never shows: not in reprs, messages, or a child's settings
    assert "pa55-w0rd" not in repr(settings) + repr(access) + str(access)
    assert str(access) == "kafka-1:9093 (SCRAM-SHA-512 as 'trainer' over SASL_SSL)"
    env = settings.as_env()
    assert "SLIPSTREAM_KAFKA_SASL_PASSWORD" not in env and env["SLIPSTREAM_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    # PLAINTEXT stays what it was
    assert client_config("127.0.0.1:9092") == {"bootstrap.servers": "127.0.0.1:9092", "security.protocol": "PLAINTEXT"}


@pytest.mark.parametrize("env, message", [
    ({"SLIPSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL"}, "SECURITY_PROTOCOL must be one of"),
    ({"SLIPSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "SLIPSTREAM_KAFKA_SASL_MECHANISM": "GSSAPI"},
     "SASL_MECHANISM must be one of"),
    ({"SLIPSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "SLIPSTREAM_KAFKA_SASL_MECHANISM": "PLAIN",
      "SLIPSTREAM_KAFKA_SASL_USERNAME": "u"}, "needs SLIPSTREAM_KAFKA_SASL_USERNAME and SLIPSTREAM_KAFKA_SASL_PASSWORD"),
])
def test_incomplete_security_is_refused_naming_the_setting(tmp_path: Path, env: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=message):
        KafkaAccess.from_settings(Settings.from_env({"SLIPSTREAM_HOME": str(tmp_path), **env}))


def test_airflow_tasks_take_credentials_from_the_connection(tmp_path: Path) -> None:
    from slipstream_airflow.kafka_connection import kafka_child_env, with_kafka_connection

    base = Settings.from_env({"SLIPSTREAM_HOME": str(tmp_path), "SLIPSTREAM_KAFKA_CONN_ID": "kafka_prod"})
    conn = SimpleNamespace(host="kafka-1", port=9093, login="airflow", password="from-the-connection",
                           extra_dejson={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256"})
    settings = with_kafka_connection(base, conn)
    cfg = client_config(KafkaAccess.from_settings(settings))
    assert cfg["bootstrap.servers"] == "kafka-1:9093" and cfg["sasl.password"] == "from-the-connection"
    assert cfg["sasl.mechanism"] == "SCRAM-SHA-256" and cfg["sasl.username"] == "airflow"
    child = kafka_child_env(settings)  # the local torchrun's environment, not the rendered spec
    assert child["SLIPSTREAM_KAFKA_SASL_PASSWORD"] == "from-the-connection"
    assert "from-the-connection" not in str(settings.as_env())
    assert with_kafka_connection(Settings.from_env({"SLIPSTREAM_HOME": str(tmp_path)})).kafka_sasl_password == ""
