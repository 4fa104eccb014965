"""The generator's stream as raw events on the joiner's input topics (the demo and `slipstream
generate`): impressions and clicks, keyed by user, in time order."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from slipstream.dev.producers import registered_producer
from slipstream.errors import StackError
from slipstream.joiner.raw_topics import produce_events, raw_producer
from slipstream.samples.spec import Spec
from slipstream.stream.kafka import Broker, create_topic

log = logging.getLogger(__name__)


def _rows(table: pa.Table, time_field: str) -> list[dict[str, Any]]:
    us = pc.cast(table.column(time_field), pa.int64())
    rows: list[dict[str, Any]] = table.set_column(table.column_names.index(time_field), time_field, us).to_pylist()
    return rows


def produce_raw_stream(broker: Broker, spec: Spec, events: tuple[pa.Table, pa.Table], partitions: int,
                       home: Path | None = None) -> dict[str, int]:
    """Produce impressions to the spec's events topic and clicks to its labels topic (both named
    after the sources), interleaved in event-time order as live traffic arrives (a replay that
    wrote all impressions before any click would have the joiner close windows before their
    clicks came); returns the records per topic. With `home`, registered as a producer of that
    stack (`stack down` stops it before the broker); interrupted, it flushes what it produced."""
    if home is None:
        return _produce_raw_stream(broker, spec, events, partitions)
    with registered_producer(home, "raw stream"):
        return _produce_raw_stream(broker, spec, events, partitions)


def _produce_raw_stream(broker: Broker, spec: Spec, events: tuple[pa.Table, pa.Table], partitions: int) -> dict[str, int]:
    impressions, clicks = events
    src, lab = spec.events, spec.label_source
    assert lab is not None and src.time and lab.time
    for topic in (src.name, lab.name):
        create_topic(broker, topic, partitions)
    imp_rows = _rows(impressions, src.time)
    click_rows = _rows(clicks, lab.time)
    merged = sorted([(r[src.time], 0, i) for i, r in enumerate(imp_rows)] +
                    [(r[lab.time], 1, i) for i, r in enumerate(click_rows)])
    producer = raw_producer(broker)
    try:
        for _, kind, i in merged:
            if kind == 0:
                row = imp_rows[i]
                produce_events(broker, src.name, [row], [row["user_id"]], src.time, producer=producer, flush=False)
            else:
                row = dict(click_rows[i])
                user = row.pop("user_id")
                produce_events(broker, lab.name, [row], [user], lab.time, producer=producer, flush=False)
    except BaseException:
        left = producer.flush(10)  # what was produced is acknowledged (or reported) before the exit
        log.warning("raw stream interrupted; %d produced records not acknowledged", left)
        raise
    left = producer.flush(60)
    if left:
        raise StackError(f"{left} raw events were not acknowledged by {broker} within 60s")
    out = {src.name: len(imp_rows), lab.name: len(click_rows)}
    log.info("produced %d raw impressions to %s and %d clicks to %s", out[src.name], src.name, out[lab.name], lab.name)
    return out
