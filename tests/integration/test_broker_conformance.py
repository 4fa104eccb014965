"""The embedded broker (noida-db) against what Slipstream relies on: transactions, aborts,
`read_committed` from any offset, a producer killed mid-transaction, restart with acknowledged data.

One behaviour is a known defect that the code works around, asserted as it is: a plain
`read_committed` consumer whose fetch starts after a producer's abort marker gets none of that
producer's later records (its position still passes them). `CommittedReader` reads through it.
When a test named `..._defect_...` fails, the broker no longer has the defect: keep the reader
(correct on every broker) and update docs/trainer.md's broker section.
"""

from __future__ import annotations

import time
from datetime import UTC
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from stream_fixtures import TxnLayout, killed_mid_transaction, transactional_producer, write_transactions

from slipstream.stream.committed import CommittedReader
from slipstream.stream.committed_count import count_committed
from slipstream.stream.kafka import consumer_config
from tests.trainer_fixtures import Broker

pytestmark = pytest.mark.integration


def values(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


@pytest.fixture(scope="module")
def txn_topic(kafka_bootstrap: str) -> TxnLayout:
    """Offsets 0-9 committed (marker 10), 11-20 aborted (marker 21), 22-31 committed (marker 32)."""
    layout = write_transactions(kafka_bootstrap, "conformance-txn", [(True, values("a", 10)), (False, values("b", 10)),
                                                                     (True, values("c", 10))], txn_id="conformance")
    assert layout.committed == [*range(10), *range(22, 32)] and layout.aborted == [(11, 21)] and layout.end == 33
    return layout


def plain_read(bootstrap: str, topic: str, start: int, end: int, timeout_s: float = 10.0) -> tuple[list[int], int]:
    """What a plain read_committed consumer assigned at `start` hands over until its position
    reaches `end`: (offsets, its position)."""
    c = Consumer(consumer_config(bootstrap, group=f"plain-{time.monotonic_ns()}"))
    tp = TopicPartition(topic, 0)
    try:
        c.assign([TopicPartition(topic, 0, start)])
        got: list[int] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got += [m.offset() for m in c.consume(1000, timeout=0.1) if m.error() is None]
            if c.position([tp])[0].offset >= end:
                break
        return got, c.position([tp])[0].offset
    finally:
        c.close()


def read_to_end(reader: CommittedReader, timeout_s: float = 20.0) -> list[int]:
    """Poll until the reader's lag is 0 on every partition; the offsets handed over."""
    got: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got += [m.offset() for m in reader.poll(1000, 0.2)]
        if not any(reader.lag().values()):
            return got
    raise AssertionError(f"not caught up within {timeout_s}s: positions {reader.positions}, lag {reader.lag()}, got {got}")


@pytest.mark.parametrize("start", [0, 5, 10, 11, 21])
def test_read_committed_from_before_an_abort_marker_hands_over_the_committed_records(
        kafka_bootstrap: str, txn_topic: TxnLayout, start: int) -> None:
    got, position = plain_read(kafka_bootstrap, txn_topic.topic, start, txn_topic.end)
    assert got == txn_topic.committed_in(start, txn_topic.end)
    assert position == txn_topic.end


@pytest.mark.parametrize("start", [22, 25, 31])
def test_defect_read_committed_from_after_an_abort_marker_hands_over_nothing(
        kafka_bootstrap: str, txn_topic: TxnLayout, start: int) -> None:
    """The defect we work around: the committed records 22-31 are passed silently (a real Kafka
    broker hands them over)."""
    got, position = plain_read(kafka_bootstrap, txn_topic.topic, start, txn_topic.end)
    assert got == [] and position == txn_topic.end


@pytest.mark.parametrize("start", [0, 5, 10, 11, 15, 21, 22, 25, 31, 32, 33])
def test_committed_reader_hands_over_every_committed_record_from_any_offset(
        kafka_bootstrap: str, txn_topic: TxnLayout, start: int) -> None:
    # lead=0: the client's first fetch starts at `start` (by default the reader starts a little before)
    for lead in (0, 256):
        with CommittedReader(kafka_bootstrap, txn_topic.topic, {0: start}, group=f"any-{start}-{lead}", lead=lead) as r:
            assert read_to_end(r) == txn_topic.committed_in(start, txn_topic.end)
            assert r.positions == {0: txn_topic.end}
            recovered = r.stats.recovered
        if lead == 0:  # a fetch from up to the abort marker reads through it; after it, the client passes the rest
            assert recovered == (len(txn_topic.committed_in(start, txn_topic.end)) if start > 21 else 0)


def test_defect_a_reader_that_read_through_an_abort_misses_the_producers_next_commits_and_ours_does_not(
        kafka_bootstrap: str) -> None:
    """A trainer tailing the joiner's topic when the joiner's transaction is aborted: every later
    transaction of that producer is passed by a plain consumer (position at the end, lag 0)."""
    topic = "conformance-tail"
    layout = write_transactions(kafka_bootstrap, topic, [(True, values("a", 10)), (False, values("b", 10))],
                                txn_id="tail")
    plain = Consumer(consumer_config(kafka_bootstrap, group="tail-plain"))
    plain.assign([TopicPartition(topic, 0, 0)])
    with CommittedReader(kafka_bootstrap, topic, {0: 0}, group="tail-ours") as reader:
        got = read_to_end(reader)
        plain_got = [m.offset() for m in plain.consume(1000, timeout=2) if m.error() is None]
        assert got == plain_got == layout.committed
        producer = transactional_producer(kafka_bootstrap, "tail")
        for tag in ("c", "d"):
            layout = write_transactions(kafka_bootstrap, topic, [(True, values(tag, 10))], layout=layout, producer=producer)
            got += read_to_end(reader)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            plain_got += [m.offset() for m in plain.consume(1000, timeout=0.2) if m.error() is None]
        assert got == layout.committed  # 10 + 10 + 10, each once
        assert plain_got == layout.committed[:10]  # the defect: 20 committed records passed
        assert plain.position([TopicPartition(topic, 0)])[0].offset == layout.end
    plain.close()


def test_a_producer_killed_mid_transaction_is_aborted_by_its_successor_and_readers_get_every_commit(
        kafka_bootstrap: str) -> None:
    """The broker half of "kill -9 the joiner while a trainer tails": a reader polling throughout
    hands over each committed record once; readers started anywhere after count the same."""
    topic = "conformance-killed"
    got: list[int] = []
    reader = CommittedReader(kafka_bootstrap, topic, {0: 0}, group="killed-tail")

    def poll_for(stage: str) -> None:
        if stage == "committed":
            reader.seek({0: 0})
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            got.extend(m.offset() for m in reader.poll(1000, 0.1))

    try:
        layout = killed_mid_transaction(kafka_bootstrap, topic, values("before", 30), values("after", 30), doomed=20,
                                        between=poll_for)
        got += read_to_end(reader)
    finally:
        reader.close()
    (first, marker), = layout.aborted
    assert marker == first + 20 and len(layout.committed) == 60
    assert got == layout.committed
    for start in (0, first, first + 5, marker, marker + 1, marker + 10):
        counted = count_committed(kafka_bootstrap, topic, {0: (start, layout.end)})
        assert counted.offsets[0].tolist() == layout.committed_in(start, layout.end), start


def test_a_resume_far_after_an_abort_is_read_at_a_bounded_cost(kafka_bootstrap: str) -> None:
    """3,000 committed, an abort, 3,000 committed: a reader resumed 2,000 records after the abort
    marker backs off (doubling) to before it, a few re-reads; so does a second abort after it."""
    topic = "conformance-far"
    chunks = [(True, values(f"c{i}", 500)) for i in range(6)]
    layout = write_transactions(kafka_bootstrap, topic, [*chunks, (False, values("x", 100)), *chunks,
                                                         (False, values("y", 100))], txn_id="far")
    resume = layout.aborted[0][1] + 2000
    with CommittedReader(kafka_bootstrap, topic, {0: resume}, group="far") as reader:
        assert read_to_end(reader) == layout.committed_in(resume, layout.end)
        assert reader.positions == {0: layout.end}
        assert reader.stats.recovered == len(layout.committed_in(resume, layout.end))
        assert reader.stats.rereads <= 6


def test_a_trailing_abort_is_shown_empty_without_reading_the_partition_again(kafka_bootstrap: str) -> None:
    """A topic that ends with an aborted transaction (a joiner killed, its successor not yet
    writing): the reader's lag reaches 0 after one re-read of the records just before it, checked
    against what it handed over, not the partition from its start."""
    topic = "conformance-trailing"
    layout = write_transactions(kafka_bootstrap, topic, [*[(True, values(f"c{i}", 500)) for i in range(6)],
                                                         (False, values("y", 100))], txn_id="trailing")
    with CommittedReader(kafka_bootstrap, topic, {0: 1000}, group="trailing") as reader:
        assert read_to_end(reader) == layout.committed_in(1000, layout.end)
        assert reader.positions == {0: layout.end}
        assert reader.stats.gaps_verified == 1 and reader.stats.recovered == 0
        assert reader.stats.reread_records <= 256


def test_a_handoff_offset_right_after_an_abort_marker_is_found_and_read(kafka_bootstrap: str) -> None:
    """Committed records before T - lateness, an aborted transaction, committed records after:
    the broker's offsets_for_times answers the first committed record after the abort marker,
    which a plain read from there never hands over ("no record arrived"); the handoff verifies
    it through the reader."""
    from datetime import datetime

    from slipstream.stream.handoff import find_handoff

    t = datetime(2026, 11, 3, tzinfo=UTC)
    t_ms = int(t.timestamp() * 1000)
    early = [(f"early-{i}".encode(), t_ms - 3_600_000 + i) for i in range(10)]
    late = [(f"late-{i}".encode(), t_ms + i) for i in range(10)]
    layout = write_transactions(kafka_bootstrap, "conformance-handoff", [(True, early), (False, early), (True, late)],
                                txn_id="handoff")
    plan = find_handoff(kafka_bootstrap, layout.topic, t, 0.0)
    after = layout.aborted[0][1] + 1
    assert 10 <= plan.offsets[0] <= after  # every offset there has the early records before, the late ones at/after
    counted = count_committed(kafka_bootstrap, layout.topic, {0: (plan.offsets[0], layout.end)})
    assert counted.offsets[0].tolist() == layout.committed_in(after, layout.end)


def test_restart_keeps_acknowledged_records_and_the_defect(tmp_path: Path) -> None:
    """SIGTERM with nothing in flight keeps every acknowledged record and the transactions'
    outcomes; the defect survives the restart, and so does the reader's way through it."""
    broker = Broker(tmp_path / "data")
    broker.start()
    try:
        topic = "conformance-restart"
        layout = write_transactions(broker.bootstrap, topic, [(True, values("a", 200)), (False, values("b", 50)),
                                                              (True, values("c", 200))], txn_id="restart")
        time.sleep(1.5)  # nothing in flight: the broker has written what it acknowledged
        broker.stop()
        broker.start()
        assert plain_read(broker.bootstrap, topic, 0, layout.end) == (layout.committed, layout.end)
        after = layout.aborted[0][1] + 1
        assert plain_read(broker.bootstrap, topic, after, layout.end) == ([], layout.end)  # the defect, after a restart too
        counted = count_committed(broker.bootstrap, topic, {0: (after, layout.end)})
        assert counted.offsets[0].tolist() == layout.committed_in(after, layout.end)
    finally:
        broker.stop()
