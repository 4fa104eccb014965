"""The join state's changelog: one Kafka partition per task, written inside the same transaction
as the samples and the input offsets, so after a crash the state, the offsets and the output all
stand at the last commit (exactly once). Each record is one commit's changes of one task."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from slipstream.errors import StackError
from slipstream.stream.kafka import Broker, consumer_config

log = logging.getLogger(__name__)

CHUNK_ENTRIES = 2_000
"""Entries per changelog record (a record stays well under the broker's size limits)."""


def encode_changes(changes: dict[str, Any]) -> Iterator[bytes]:
    """One task's changes as one or more records (big tables split; applied in order, each key
    appears in one record only)."""
    small = {k: v for k, v in changes.items() if not isinstance(v, dict) or len(v) <= CHUNK_ENTRIES}
    yield json.dumps(small, separators=(",", ":")).encode()
    for name, table in changes.items():
        if isinstance(table, dict) and len(table) > CHUNK_ENTRIES:
            items = list(table.items())
            for i in range(0, len(items), CHUNK_ENTRIES):
                yield json.dumps({name: dict(items[i:i + CHUNK_ENTRIES])}, separators=(",", ":")).encode()


def read_changelog(broker: Broker, topic: str, partition: int, group: str, timeout_s: float = 60.0) -> Iterator[dict[str, Any]]:
    """Every committed change record of one task, oldest first (read_committed, up to the end the
    partition had when called; records of aborted transactions are skipped by the client)."""
    consumer = Consumer(consumer_config(broker, group=group, **{"enable.partition.eof": True}))
    tp = TopicPartition(topic, partition)
    try:
        low, high = consumer.get_watermark_offsets(tp, timeout=10)
        if high <= low:
            return
        consumer.assign([TopicPartition(topic, partition, low)])
        deadline = time.monotonic() + timeout_s
        while True:
            for m in consumer.consume(1000, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return
                    raise KafkaException(err)
                yield json.loads(m.value())
                if m.offset() + 1 >= high:
                    return
            position = consumer.position([tp])[0].offset
            if position >= high:
                return
            if time.monotonic() > deadline:
                raise StackError(f"reading the joiner's state {topic}[{partition}] did not reach its end (offset {high}) "
                                 f"within {timeout_s:.0f}s (at {position}): is an old joiner's transaction still open?")
    finally:
        consumer.close()
