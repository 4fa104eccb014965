"""slipstream.stream.handoff against the real broker: verified offsets_for_times, the binary-search
fallback for brokers that answer wrongly, empty partitions and out-of-order (late) records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from slipstream.errors import HandoffError
from slipstream.stream.handoff import find_handoff, handoff_offsets, target_ms
from slipstream.stream.kafka import consumer_config, create_topic

pytestmark = pytest.mark.integration

T = datetime(2026, 11, 3, tzinfo=UTC)
LATENESS_S = 120
T_MS = int(T.timestamp() * 1000)


def _timestamps() -> list[int]:
    """Partition 0: one record every 10 s from T-30min to T+30min, produce order = ts + delay,
    with every 7th record up to 100 s late (out of order, within max lateness)."""
    ts = [T_MS + s * 1000 for s in range(-1800, 1800, 10)]
    delayed = [(t + (100_000 if i % 7 == 0 else 0), t) for i, t in enumerate(ts)]
    return [t for _, t in sorted(delayed)]


@pytest.fixture(scope="module")
def hand_topic(kafka_bootstrap: str) -> tuple[str, list[int]]:
    name = "handoff-unit-records"
    create_topic(kafka_bootstrap, name, 3)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    stamps = _timestamps()
    for i, ts in enumerate(stamps):
        p.produce(name, value=f"{i}".encode(), partition=0, timestamp=ts)
    for k in range(5):  # partition 2: all records long before T
        p.produce(name, value=b"old", partition=2, timestamp=T_MS - 86_400_000 + k)
    p.flush(30)
    return name, stamps  # partition 1 stays empty


def _read_all(bootstrap: str, topic: str, partition: int, n: int) -> list[int]:
    c = Consumer(consumer_config(bootstrap, group="handoff-check"))
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        out: list[int] = []
        for _ in range(100):
            out += [m.timestamp()[1] for m in c.consume(1000, timeout=0.2) if m.error() is None]
            if len(out) >= n:
                break
        return out
    finally:
        c.close()


def _assert_safe(stamps: list[int], offset: int) -> None:
    """Nothing with event time >= T before the start; the record before it is < T - lateness."""
    assert all(ts < T_MS for ts in stamps[:offset])
    assert offset == 0 or stamps[offset - 1] < T_MS - LATENESS_S * 1000
    assert offset == len(stamps) or stamps[offset] >= T_MS - LATENESS_S * 1000


def test_broker_answer_is_verified_and_used(kafka_bootstrap: str, hand_topic: tuple[str, list[int]]) -> None:
    topic, stamps = hand_topic
    assert _read_all(kafka_bootstrap, topic, 0, len(stamps)) == stamps  # the broker kept our timestamps
    plan = find_handoff(kafka_bootstrap, topic, T, LATENESS_S)
    h0 = plan.partitions[0]
    assert h0.method == "offsets_for_times"
    _assert_safe(stamps, h0.offset)
    assert plan.partitions[1].method == "empty" and plan.partitions[1].offset == 0
    assert plan.partitions[2].offset == 5  # every record is before T: start at the end


@pytest.mark.parametrize("wrong", ["zero", "end", "error"])
def test_wrong_broker_answers_fall_back_to_binary_search(
    kafka_bootstrap: str, hand_topic: tuple[str, list[int]], wrong: str
) -> None:
    topic, stamps = hand_topic
    right = handoff_offsets(kafka_bootstrap, topic, T, LATENESS_S)

    def liar(tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        answer = {"zero": 0, "end": len(stamps), "error": -1}[wrong]
        return [TopicPartition(tp.topic, tp.partition, answer) for tp in tps]

    plan = find_handoff(kafka_bootstrap, topic, T, LATENESS_S, offsets_for_times=liar)
    h0 = plan.partitions[0]
    # -1 means "no record at or after the time": the end, which is wrong here too
    assert h0.method == "search"
    _assert_safe(stamps, h0.offset)
    # late records make several offsets valid starts; the search finds one near the broker's
    assert abs(h0.offset - right[0]) <= 10
    assert plan.partitions[2].offset == 5


def test_handoff_before_and_after_all_records(kafka_bootstrap: str, hand_topic: tuple[str, list[int]]) -> None:
    topic, stamps = hand_topic
    assert handoff_offsets(kafka_bootstrap, topic, T - timedelta(days=3), 0)[0] == 0
    assert handoff_offsets(kafka_bootstrap, topic, T + timedelta(days=3), 0)[0] == len(stamps)


def test_missing_topic_is_a_clear_error(kafka_bootstrap: str) -> None:
    with pytest.raises(HandoffError, match="does not exist"):
        handoff_offsets(kafka_bootstrap, "no-such-topic-for-handoff", T, LATENESS_S, timeout_s=3)


def test_target_is_t_minus_lateness_in_ms() -> None:
    assert target_ms(T, LATENESS_S) == T_MS - 120_000
    assert target_ms(T + timedelta(microseconds=1500), 0) == T_MS + 1
    with pytest.raises(HandoffError, match="timezone"):
        target_ms(datetime(2026, 11, 3), 0)
