"""The stream phase's reader on a topic written by a transactional producer (the joiner's): every
transaction ends with a commit marker the reader never receives, so "caught up" must count the
client's position past markers, or the trainer waits for records that do not exist."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from joiner_fixtures import START_US, batch_samples, make_events

from slipstream.samples.codec import encode_samples
from slipstream.stream.kafka import client_config, create_topic
from tests.integration.test_joiner import SPEC

pytestmark = pytest.mark.integration


def test_a_transactional_topic_read_to_its_end_is_caught_up(kafka_bootstrap: str) -> None:
    from trainers.data.kafka_source import KafkaSource

    topic = "txn-samples"
    create_topic(kafka_bootstrap, topic, 1)
    imps, _, labels = make_events(30, seed=31)
    values = encode_samples(batch_samples(SPEC, imps, labels), "json", SPEC)
    producer = Producer(client_config(kafka_bootstrap, **{"transactional.id": "txn-test"}))
    producer.init_transactions(30)
    for chunk in (values[:10], values[10:20], values[20:]):  # three transactions: three markers
        producer.begin_transaction()
        for v in chunk:
            producer.produce(topic, value=v, key=b"1")
        producer.commit_transaction(30)
    src = KafkaSource(bootstrap=kafka_bootstrap, topic=topic, dlq_topic=f"{topic}.dlq", partitions=[0], positions={0: 0},
                      t_handoff_us=START_US, consume_batch=1000, consume_timeout_s=0.2, lag_interval_s=0.0,
                      group="txn-reader", spec=SPEC)
    rows, deadline = 0, time.monotonic() + 30
    while time.monotonic() < deadline:
        rows += len(src.poll())
        if src.idle and src.lag(refresh=True) == 0:
            break
    assert src.lag(refresh=True) == 0  # without counting the markers: 1 per transaction's partition, forever
    assert 0 < rows <= len(values)  # every record read (the held-out ones are kept out of training rows)
    assert src.positions[0] == len(values) + 3  # 30 records and three commit markers: the committed end


def test_a_reader_polling_through_an_aborted_transaction_reads_the_next_committed_one(kafka_bootstrap: str) -> None:
    """A joiner killed mid-transaction: its successor (same transactional id) fences it, which
    aborts the open transaction, and commits the next. A reader that was polling all along must
    hand over every committed record. On noida-db the client skipped the next transaction's
    committed records too (position at the end, 1,000 records short, lag 0: "caught up"); the
    reader now reads a skipped range a second time."""
    from trainers.data.kafka_source import KafkaSource

    topic = "txn-aborted-midway"
    create_topic(kafka_bootstrap, topic, 1)
    imps, _, labels = make_events(3000, seed=37)
    values = encode_samples(batch_samples(SPEC, imps, labels), "json", SPEC)
    src = KafkaSource(bootstrap=kafka_bootstrap, topic=topic, dlq_topic=f"{topic}.dlq", partitions=[0], positions={0: 0},
                      t_handoff_us=START_US, consume_batch=1000, consume_timeout_s=0.2, lag_interval_s=0.0,
                      group="txn-abort-reader", spec=SPEC)

    def read_for(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            src.poll()
            if src.idle and src.lag(refresh=True) == 0 and src.counters.records == 2000:
                return

    first = Producer(client_config(kafka_bootstrap, **{"transactional.id": "joiner-0"}))
    first.init_transactions(30)
    first.begin_transaction()
    for v in values[:1000]:
        first.produce(topic, value=v, key=b"1")
    first.commit_transaction(30)
    read_for(2)
    first.begin_transaction()  # killed mid-transaction: its records are on the broker, never committed
    for v in values[1000:2000]:
        first.produce(topic, value=v, key=b"1")
    first.flush(30)
    read_for(2)
    successor = Producer(client_config(kafka_bootstrap, **{"transactional.id": "joiner-0"}))
    successor.init_transactions(30)  # fences the first producer: its transaction is aborted
    successor.begin_transaction()
    for v in values[2000:]:
        successor.produce(topic, value=v, key=b"1")
    successor.commit_transaction(30)
    read_for(20)
    assert src.counters.records == 2000  # the two committed transactions, each record once
    assert src.lag(refresh=True) == 0 and src.positions[0] >= 3002
