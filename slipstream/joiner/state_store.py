"""The join state's changelog: one Kafka partition per task, written inside the same transaction
as the samples and the input offsets, so after a crash the state, the offsets and the output all
stand at the last commit (exactly once). One commit of one task writes the impressions it took
and the sequence tails it wrote (Arrow IPC records), then its other changes with the watermark
(JSON records)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from slipstream.errors import StackError
from slipstream.stream.kafka import Broker, consumer_config

log = logging.getLogger(__name__)

CHUNK_ENTRIES = 2_000
"""Entries per JSON changelog record (a record stays well under the broker's size limits)."""
CHUNK_ROWS = 5_000
"""Rows per Arrow changelog record."""
KIND = "slipstream.changes"


def encode_table(table: pa.Table, kind: str) -> Iterator[bytes]:
    """A table of changes (a task's new impressions, a sequence feature's tails) as Arrow IPC
    streams of at most CHUNK_ROWS rows each, labelled `kind` in their schema's metadata
    (`table_kind` reads it back): written before the JSON record of the same commit, and replayed
    before it."""
    table = table.replace_schema_metadata({KIND: kind})
    for batch in table.combine_chunks().to_batches(max_chunksize=CHUNK_ROWS):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_batch(batch)
        yield sink.getvalue().to_pybytes()


def table_kind(table: pa.Table) -> str:
    kind: bytes = (table.schema.metadata or {}).get(KIND.encode(), b"")
    return kind.decode()


def encode_changes(changes: dict[str, Any]) -> Iterator[bytes]:
    """One task's changes as one or more JSON records (big tables split, each key in one record
    only); the record with the watermark comes last, so a replay moves time after the rest."""
    for name, table in changes.items():
        if isinstance(table, dict) and len(table) > CHUNK_ENTRIES:
            items = list(table.items())
            for i in range(0, len(items), CHUNK_ENTRIES):
                yield json.dumps({name: dict(items[i:i + CHUNK_ENTRIES])}, separators=(",", ":")).encode()
    small = {k: v for k, v in changes.items() if not isinstance(v, dict) or len(v) <= CHUNK_ENTRIES}
    yield json.dumps(small, separators=(",", ":")).encode()


def read_changelog(broker: Broker, topic: str, partition: int, group: str,
                   timeout_s: float = 60.0) -> Iterator[dict[str, Any] | pa.Table]:
    """Every committed change record of one task (JSON changes, or a table of rows), oldest first
    (read_committed, up to the end the partition had when called; records of aborted transactions
    are skipped by the client)."""
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
                value = cast(bytes, m.value())  # `encode_changes`/`encode_table` wrote every record: never a tombstone
                yield json.loads(value) if value[:1] == b"{" else pa.ipc.open_stream(value).read_all()
                if cast(int, m.offset()) + 1 >= high:  # a consumed record has its offset
                    return
            position = consumer.position([tp])[0].offset
            if position >= high:
                return
            if time.monotonic() > deadline:
                raise StackError(f"reading the joiner's state {topic}[{partition}] did not reach its end (offset {high}) "
                                 f"within {timeout_s:.0f}s (at {position}): is an old joiner's transaction still open?")
    finally:
        consumer.close()
