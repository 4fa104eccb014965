"""The spec's side tables (users, items: `kind: table` sources) for the joiner, read from topics.

Each side table is a topic (by default named like the source) of JSON rows keyed by the table's
key; the newest row of a key is the table's row, as in a compacted topic (Kafka Streams calls it a
global table). Every replica reads every partition of it, outside the consumer group: at start up
to the end offsets it finds (`load`), then whatever arrives (`poll`, once per loop). The joined
features therefore see the rows the topic held when the sample's window closed, the stream's
version of the batch path joining the day's table files. A row that is not JSON, lacks the key
or has a wrong type is skipped, counted and logged with its topic, partition and offset (it stays
in the topic for a person to inspect and re-publish); it stops nothing.
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, TopicPartition

from slipstream.joiner.events import BadEvent, parse_batch, parse_fields
from slipstream.samples.schema import source_arrow_schema
from slipstream.samples.spec import SourceSpec, Spec
from slipstream.samples.transform import last_per_key
from slipstream.stream.kafka import Broker, consumer_config, create_topic

log = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 60.0
POLL_BATCH = 10_000


class SideTables:
    def __init__(self, spec: Spec, broker: Broker, topics: dict[str, str] | None = None, partitions: int = 1) -> None:
        """`topics`: a side table's topic where it is not the source's name."""
        self.sources = {s.name: s for s in spec.tables}
        self.topics = {name: (topics or {}).get(name, name) for name in self.sources}
        self.by_topic = {t: self.sources[n] for n, t in self.topics.items()}
        self.tables: dict[str, pa.Table] = {n: source_arrow_schema(s).empty_table() for n, s in self.sources.items()}
        self.bad = 0
        self.consumer: Consumer | None = None
        if not self.sources:
            return
        for topic in self.topics.values():
            create_topic(broker, topic, partitions)
        self.consumer = Consumer(consumer_config(broker, group="slipstream-joiner-side-tables"))
        assigned = []
        for topic in self.topics.values():
            parts = self.consumer.list_topics(topic, timeout=10).topics[topic].partitions
            assigned += [TopicPartition(topic, p, 0) for p in parts]
        self.consumer.assign(assigned)  # every partition, no group: each replica holds whole tables
        self.assigned = assigned

    def load(self, timeout_s: float = LOAD_TIMEOUT_S) -> dict[str, pa.Table]:
        """Read every side-table topic up to the end offsets it has now; returns the tables."""
        if self.consumer is None:
            return self.tables
        ends = {(tp.topic, tp.partition): self.consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in self.assigned}
        done = {k for k, end in ends.items() if end == 0}
        deadline = time.monotonic() + timeout_s
        while len(done) < len(ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"side tables {', '.join(self.topics.values())} not read to their end within "
                                   f"{timeout_s:.0f}s: is the broker up?")
            for m in self._take(timeout_s=0.5):
                if m.offset() + 1 >= ends[(m.topic(), m.partition())]:
                    done.add((m.topic(), m.partition()))
        log.info("side tables loaded: %s", {n: t.num_rows for n, t in self.tables.items()})
        return self.tables

    def poll(self) -> bool:
        """Take what arrived since; True when a table changed."""
        if self.consumer is None:
            return False
        return bool(self._take(timeout_s=0.0))

    def _take(self, timeout_s: float) -> list[Any]:
        assert self.consumer is not None
        msgs = self.consumer.consume(POLL_BATCH, timeout=timeout_s)
        good: dict[str, list[Any]] = {}
        for m in msgs:
            err = m.error()
            if err is not None and err.code() != KafkaError._PARTITION_EOF:
                raise RuntimeError(f"side table {m.topic()}: {err}")
            if err is None:
                good.setdefault(cast(str, m.topic()), []).append(m)  # a consumed record names its topic
        for topic, batch in good.items():
            self._merge(self.by_topic[topic], batch)
        return [m for batch in good.values() for m in batch]

    def _merge(self, source: SourceSpec, batch: list[Any]) -> None:
        rows = parse_batch([m.value() for m in batch], source)
        if rows is None:  # a bad record in the batch: one by one, naming the bad ones
            schema, parsed = source_arrow_schema(source), []
            for m in batch:
                try:
                    row = parse_fields(m.value(), source)
                    if row.get(source.key or "") is None:
                        raise BadEvent(f"missing key {source.key}")
                    parsed.append(pa.Table.from_pylist([row], schema=schema))
                except (BadEvent, pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
                    self.bad += 1
                    log.warning("side table %s: skipped %s[%d]@%d: %s", source.name, m.topic(), m.partition(),
                                m.offset(), e)
            rows = pa.concat_tables(parsed) if parsed else schema.empty_table()
        rows = rows.cast(source_arrow_schema(source))
        merged = pa.concat_tables([self.tables[source.name], rows])
        self.tables[source.name] = last_per_key(merged, source.key or "").combine_chunks()

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None
