"""Kafka helpers: the one client configuration, topics, producing samples.

Works with any Kafka-protocol broker by `bootstrap.servers`; the embedded stack runs noida-db.
Every Kafka client Slipstream makes (consumers, producers, the dead-letter producer, admin
clients, the audit's reader, the handoff) is configured by `client_config` from a `KafkaAccess`:
the broker address plus its security (TLS files, SASL mechanism and credentials), parsed once
from the settings (`KafkaAccess.from_settings`). A plain bootstrap string means PLAINTEXT.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # confluent_kafka.admin re-exports it without __all__

from slipstream.errors import ConfigError, StackError
from slipstream.samples.codec import encode_samples
from slipstream.samples.schema import DEFAULT_SPEC
from slipstream.samples.spec import Spec

log = logging.getLogger(__name__)

TOPIC_CONFIG = {"retention.ms": "-1"}
"""Keep samples forever by default: some brokers apply time retention to record timestamps, and a
replayed history (event times days ago) would otherwise be deleted on arrival."""

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class KafkaAuthError(StackError):
    """The broker refused the client's credentials; the message names broker, mechanism and user."""


@dataclass(frozen=True)
class KafkaAccess:
    """Where the broker is and how to reach it securely: everything a client needs but its role."""

    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str = ""
    sasl_username: str = ""
    sasl_password: str = field(default="", repr=False)
    ssl_ca_location: str = ""
    ssl_certificate_location: str = ""
    ssl_key_location: str = ""
    ssl_key_password: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(f"SLIPSTREAM_KAFKA_SECURITY_PROTOCOL must be one of {', '.join(SECURITY_PROTOCOLS)}, "
                              f"got {self.security_protocol!r}")
        if self.sasl:
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise ConfigError(f"SLIPSTREAM_KAFKA_SASL_MECHANISM must be one of {', '.join(SASL_MECHANISMS)} with "
                                  f"{self.security_protocol}, got {self.sasl_mechanism!r}")
            if not self.sasl_username or not self.sasl_password:
                raise ConfigError(f"{self.security_protocol} needs SLIPSTREAM_KAFKA_SASL_USERNAME and "
                                  "SLIPSTREAM_KAFKA_SASL_PASSWORD (in pods from the Kafka Secret, in Airflow "
                                  "tasks from the connection SLIPSTREAM_KAFKA_CONN_ID)")

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    def __str__(self) -> str:
        """The broker as messages name it: address, protocol, mechanism and user, never the password."""
        if self.security_protocol == "PLAINTEXT":
            return self.bootstrap
        how = f"{self.sasl_mechanism} as {self.sasl_username!r} over {self.security_protocol}" if self.sasl \
            else self.security_protocol
        return f"{self.bootstrap} ({how})"

    @classmethod
    def from_settings(cls, settings: Any, bootstrap: str = "") -> KafkaAccess:
        """The broker of `slipstream.settings.Settings` (or `bootstrap`, e.g. a run's data.bootstrap)
        with the settings' security."""
        return cls(
            bootstrap=bootstrap or settings.kafka_bootstrap,
            security_protocol=settings.kafka_security_protocol or "PLAINTEXT",
            sasl_mechanism=settings.kafka_sasl_mechanism, sasl_username=settings.kafka_sasl_username,
            sasl_password=settings.kafka_sasl_password, ssl_ca_location=settings.kafka_ssl_ca_location,
            ssl_certificate_location=settings.kafka_ssl_certificate_location,
            ssl_key_location=settings.kafka_ssl_key_location, ssl_key_password=settings.kafka_ssl_key_password,
        )


Broker = KafkaAccess | str
"""A broker as the helpers take it: a KafkaAccess, or a bootstrap string (PLAINTEXT)."""


def as_access(broker: Broker) -> KafkaAccess:
    return broker if isinstance(broker, KafkaAccess) else KafkaAccess(bootstrap=broker)


def client_config(broker: Broker, **overrides: Any) -> dict[str, Any]:
    """The configuration of any Kafka client: `bootstrap.servers` and the security settings, plus
    the client's own keys (`overrides`). A refused login raises KafkaAuthError from the client's
    next poll/consume/flush, naming the broker, the mechanism and the user."""
    access = as_access(broker)
    cfg: dict[str, Any] = {"bootstrap.servers": access.bootstrap, "security.protocol": access.security_protocol}
    if access.sasl:
        cfg.update({"sasl.mechanism": access.sasl_mechanism, "sasl.username": access.sasl_username,
                    "sasl.password": access.sasl_password})
    for key, value in (("ssl.ca.location", access.ssl_ca_location), ("ssl.certificate.location", access.ssl_certificate_location),
                       ("ssl.key.location", access.ssl_key_location), ("ssl.key.password", access.ssl_key_password)):
        if value:
            cfg[key] = value
    if access.security_protocol != "PLAINTEXT":
        cfg["error_cb"] = _auth_errors(access)
    cfg.update(overrides)
    return cfg


def _auth_errors(access: KafkaAccess) -> Any:
    def on_error(err: KafkaError) -> None:
        if err.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL):
            raise KafkaAuthError(f"Kafka broker {access} refused the connection: {err.str()}. Check the credentials "
                                 "(SLIPSTREAM_KAFKA_SASL_USERNAME / _PASSWORD, the Kafka Secret or connection) "
                                 "and SLIPSTREAM_KAFKA_SASL_MECHANISM / _SECURITY_PROTOCOL / TLS files")
        log.warning("Kafka client error from %s: %s", access, err)
    return on_error


def consumer_config(broker: Broker, group: str | None = None, **overrides: Any) -> dict[str, Any]:
    """Consumer settings Slipstream uses everywhere (offsets are managed by our checkpoints)."""
    cfg: dict[str, Any] = {
        "group.id": group or "slipstream-reader",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        # Some brokers ignore fetch size limits; never let a large batch break the client.
        "receive.message.max.bytes": 2_000_000_000,
        "enable.partition.eof": False,
    }
    cfg.update(overrides)
    return client_config(broker, **cfg)


def wait_for_broker(bootstrap: Broker, timeout_s: float = 30.0) -> None:
    admin = AdminClient(client_config(bootstrap))
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2)
            return
        except KafkaException as e:
            last = e
            admin.poll(0)  # serves the error callback: a refused login raises KafkaAuthError here
            time.sleep(0.2)
    access = as_access(bootstrap)
    hint = " (with security set, a refused login ends so too: check the credentials and mechanism)" \
        if access.security_protocol != "PLAINTEXT" else ""
    raise StackError(f"Kafka broker at {access} did not answer within {timeout_s:.0f}s: {last}{hint}")


def create_topic(bootstrap: Broker, topic: str, partitions: int, config: dict[str, str] | None = None) -> bool:
    """Create the topic if missing. Returns True when created, False when it already existed."""
    admin = AdminClient(client_config(bootstrap))
    existing = admin.list_topics(timeout=10).topics
    if topic in existing:
        have = len(existing[topic].partitions)
        if have != partitions:
            log.warning("topic %s exists with %d partitions (asked for %d); keeping it", topic, have, partitions)
        return False
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1, config={**TOPIC_CONFIG, **(config or {})})]
    )
    try:
        futures[topic].result(timeout=30)
    except KafkaException as e:
        if "TOPIC_ALREADY_EXISTS" in str(e):
            return False
        raise StackError(f"could not create topic {topic!r} on {bootstrap}: {e}") from e
    log.info("created topic %s with %d partitions", topic, partitions)
    return True


def delete_topic(bootstrap: Broker, topic: str) -> None:
    admin = AdminClient(client_config(bootstrap))
    futures = admin.delete_topics([topic])
    try:
        futures[topic].result(timeout=30)
    except KafkaException as e:
        if "UNKNOWN_TOPIC" not in str(e):
            raise


def produce_samples(
    bootstrap: Broker, topic: str, table: pa.Table, *, progress_every: int = 100_000, codec: str = "json",
    spec: Spec | None = None,
) -> int:
    """Produce sample rows of `spec` (the default spec: None) in table order: key = the spec's key
    column, e.g. user_id (a user's samples stay in order on one partition), value = the sample in
    `codec` (`slipstream.samples.codec`), timestamp = event_time in ms.
    Idempotent producer: a retry never duplicates a record. Returns the number produced."""
    producer = Producer(client_config(bootstrap, **{
        "enable.idempotence": True, "linger.ms": 20, "batch.num.messages": 10_000, "compression.type": "lz4",
    }))
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    values = encode_samples(table, codec, spec)
    key_col = (spec or DEFAULT_SPEC).key_column
    keys = [str(u).encode() for u in table.column(key_col).to_pylist()]
    ts_ms = pc.divide(pc.cast(table.column("event_time"), pa.int64()), 1000).to_pylist()
    started = time.monotonic()
    try:
        for i, (k, v, ts) in enumerate(zip(keys, values, ts_ms)):
            while True:
                try:
                    producer.produce(topic, value=v, key=k, timestamp=int(ts), on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            if progress_every and (i + 1) % progress_every == 0:
                rate = (i + 1) / max(time.monotonic() - started, 1e-9)
                log.info("produced %d/%d samples (%.0f/s, ETA %.0fs)", i + 1, len(values), rate, (len(values) - i - 1) / rate)
            producer.poll(0)
    except BaseException:  # interrupted (SIGTERM from `stack down`, Ctrl-C): deliver what was produced first
        left = producer.flush(10)
        log.warning("producing to %s interrupted: %d produced samples not acknowledged", topic, left)
        raise
    remaining = producer.flush(60)
    if remaining or errors:
        raise StackError(
            f"producing to {topic!r} on {bootstrap} failed: {remaining} undelivered, "
            f"errors: {errors[:3]}"
        )
    return len(values)


def end_offsets(bootstrap: Broker, topic: str) -> dict[int, int]:
    """High watermark per partition."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(consumer_config(bootstrap, group="slipstream-watermarks"))
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in sorted(parts)}
    finally:
        c.close()
