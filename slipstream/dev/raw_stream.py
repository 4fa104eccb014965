"""The generator's stream as raw events on the joiner's input topics (the demo and `slipstream
generate`): impressions and clicks, keyed by user, in time order."""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from slipstream.joiner.raw_topics import produce_events
from slipstream.samples.spec import Spec
from slipstream.stream.kafka import Broker, create_topic

log = logging.getLogger(__name__)


def _rows(table: pa.Table, time_field: str) -> list[dict]:
    us = pc.cast(table.column(time_field), pa.int64())
    return table.set_column(table.column_names.index(time_field), time_field, us).to_pylist()


def produce_raw_stream(broker: Broker, spec: Spec, events: tuple[pa.Table, pa.Table], partitions: int) -> dict[str, int]:
    """Produce impressions to the spec's events topic and clicks to its labels topic (both named
    after the sources); returns the records per topic."""
    impressions, clicks = events
    src, lab = spec.events, spec.label_source
    assert lab is not None and src.time and lab.time
    out = {}
    for topic in (src.name, lab.name):
        create_topic(broker, topic, partitions)
    imp_rows = _rows(impressions, src.time)
    out[src.name] = produce_events(broker, src.name, imp_rows, [r["user_id"] for r in imp_rows], src.time)
    click_rows = _rows(clicks, lab.time)
    keys = [r.pop("user_id") for r in click_rows]
    out[lab.name] = produce_events(broker, lab.name, click_rows, keys, lab.time)
    log.info("produced %d raw impressions to %s and %d clicks to %s", out[src.name], src.name, out[lab.name], lab.name)
    return out
