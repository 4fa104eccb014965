"""Writing raw events to the joiner's input topics (the generator, the bench, tests, and the shape
a user's own producer should have): one JSON object per record, times as ISO-8601 UTC text, the
record keyed by user so that an impression and its clicks share a partition, record timestamp =
event time."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Producer

from slipstream.errors import StackError
from slipstream.stream.kafka import Broker, client_config

log = logging.getLogger(__name__)


def iso_us(us: int) -> str:
    return datetime.fromtimestamp(us // 1_000_000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{us % 1_000_000:06d}Z"


def event_value(row: dict[str, Any], time_field: str) -> bytes:
    """A raw event as the joiner reads it: `time_field` (epoch microseconds here) as ISO text."""
    out = dict(row)
    out[time_field] = iso_us(int(row[time_field]))
    return json.dumps(out, separators=(",", ":")).encode()


def raw_producer(broker: Broker) -> Producer:
    return Producer(client_config(broker, **{"enable.idempotence": True, "linger.ms": 10, "compression.type": "lz4"}))


def produce_events(broker: Broker, topic: str, rows: Sequence[dict[str, Any]], keys: Sequence[Any], time_field: str,
                   *, progress_every: int = 100_000, producer: Producer | None = None, flush: bool = True) -> int:
    """Produce raw events in order (idempotent producer), each keyed by `keys[i]`; `producer`: one
    to reuse (the caller's, e.g. a feeder producing chunk after chunk); `flush=False` leaves the
    delivery wait to the caller (who flushes that producer)."""
    producer = producer or raw_producer(broker)
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    started = time.monotonic()
    for i, (row, key) in enumerate(zip(rows, keys)):
        value = event_value(row, time_field)
        while True:
            try:
                producer.produce(topic, value=value, key=str(key).encode(), timestamp=int(row[time_field]) // 1000,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if progress_every and (i + 1) % progress_every == 0:
            rate = (i + 1) / max(time.monotonic() - started, 1e-9)
            log.info("produced %d/%d events to %s (%.0f/s)", i + 1, len(rows), topic, rate)
        producer.poll(0)
    left = producer.flush(60) if flush else 0
    if left or errors:
        raise StackError(f"producing raw events to {topic!r} failed: {left} undelivered, errors: {errors[:3]}")
    return len(rows)
