"""Kafka helpers: topics, producing samples, consumer configuration.

Works with any Kafka-protocol broker by `bootstrap.servers`; the embedded stack runs noida-db.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from slipstream.samples.codec import encode_samples
from slipstream.samples.schema import DEFAULT_SPEC
from slipstream.samples.spec import Spec
from slipstream.errors import StackError

log = logging.getLogger(__name__)

TOPIC_CONFIG = {"retention.ms": "-1"}
"""Keep samples forever by default: some brokers apply time retention to record timestamps, and a
replayed history (event times days ago) would otherwise be deleted on arrival."""


def consumer_config(bootstrap: str, group: str | None = None, **overrides: Any) -> dict[str, Any]:
    """Consumer settings Slipstream uses everywhere (offsets are managed by our checkpoints)."""
    cfg: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
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
    return cfg


def wait_for_broker(bootstrap: str, timeout_s: float = 30.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=2)
            return
        except KafkaException as e:
            last = e
            time.sleep(0.2)
    raise StackError(f"Kafka broker at {bootstrap} did not answer within {timeout_s:.0f}s: {last}")


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict[str, str] | None = None) -> bool:
    """Create the topic if missing. Returns True when created, False when it already existed."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
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


def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_topics([topic])
    try:
        futures[topic].result(timeout=30)
    except KafkaException as e:
        if "UNKNOWN_TOPIC" not in str(e):
            raise


def produce_samples(
    bootstrap: str, topic: str, table: pa.Table, *, progress_every: int = 100_000, codec: str = "json",
    spec: Spec | None = None,
) -> int:
    """Produce sample rows of `spec` (the default spec: None) in table order: key = the spec's key
    column, e.g. user_id (a user's samples stay in order on one partition), value = the sample in
    `codec` (`slipstream.samples.codec`), timestamp = event_time in ms.
    Idempotent producer: a retry never duplicates a record. Returns the number produced."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "compression.type": "lz4",
        }
    )
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    values = encode_samples(table, codec, spec)
    key_col = (spec or DEFAULT_SPEC).key_column
    keys = [str(u).encode() for u in table.column(key_col).to_pylist()]
    ts_ms = pc.divide(pc.cast(table.column("event_time"), pa.int64()), 1000).to_pylist()
    started = time.monotonic()
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
    remaining = producer.flush(60)
    if remaining or errors:
        raise StackError(
            f"producing to {topic!r} on {bootstrap} failed: {remaining} undelivered, "
            f"errors: {errors[:3]}"
        )
    return len(values)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """High watermark per partition."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(consumer_config(bootstrap, group="slipstream-watermarks"))
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in sorted(parts)}
    finally:
        c.close()
