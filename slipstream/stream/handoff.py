"""The batch→stream handoff: where in each Kafka partition the stream phase starts.

The batch phase trains on event_time < T from Iceberg; the stream phase must see every record
with event_time >= T and may see earlier ones (it drops them). Records reach Kafka at most
`max_lateness` after their event time, and each partition is in produce order, so every record
after one with event_time >= T has event_time >= T - max_lateness. Hence any offset `o` where the
record before `o` has timestamp < target and the record at `o` has timestamp >= target, with
target = T - max_lateness, is a safe start: no record with event_time >= T can precede it.

`offsets_for_times(target)` answers exactly that on a correct broker; the answer is verified
against the two records around it, and when a broker answers wrongly (some answer 0 or the end),
a binary search over record timestamps with assign/seek finds such an offset instead. Records
are read with `slipstream.stream.committed.CommittedReader`: an offset right after an aborted
transaction reads the committed records after it on every broker, the embedded one included.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Consumer, KafkaException, TopicPartition

from slipstream.errors import HandoffError
from slipstream.stream.committed import CommittedReader, offset_of
from slipstream.stream.kafka import Broker, as_access, consumer_config

log = logging.getLogger(__name__)

OffsetsForTimes = Callable[[list[TopicPartition], float], list[TopicPartition]]
"""(partitions with the target timestamp as offset, timeout) -> partitions with the answered
offsets; the shape of `Consumer.offsets_for_times`. Tests pass a wrong one to exercise the search."""

_BACK_STEP = 64


@dataclass(frozen=True)
class PartitionHandoff:
    partition: int
    offset: int
    method: str
    """`offsets_for_times` (broker answer verified), `search` (the broker answered wrongly) or
    `empty` (no record in the partition)."""
    broker_answer: int | None = None


@dataclass(frozen=True)
class HandoffPlan:
    topic: str
    target_ms: int
    partitions: dict[int, PartitionHandoff] = field(default_factory=dict)

    @property
    def offsets(self) -> dict[int, int]:
        return {p: h.offset for p, h in sorted(self.partitions.items())}


def target_ms(t_handoff: datetime, max_lateness: timedelta | float) -> int:
    """T - max_lateness in epoch milliseconds, rounded down (record timestamps are ms)."""
    if t_handoff.tzinfo is None:
        raise HandoffError(f"t_handoff must be timezone-aware, got {t_handoff.isoformat()}")
    lateness = max_lateness if isinstance(max_lateness, timedelta) else timedelta(seconds=float(max_lateness))
    if lateness < timedelta(0):
        raise HandoffError(f"max_lateness must be >= 0, got {lateness}")
    micros = (t_handoff - lateness - datetime(1970, 1, 1, tzinfo=t_handoff.tzinfo)) // timedelta(microseconds=1)
    return micros // 1000


class _Reader:
    """Reads records of one topic by offset: committed records only, through aborted
    transactions (`CommittedReader`), so an offset right after an abort marker reads the committed
    records after it on every broker."""

    def __init__(self, consumer: Consumer, reader: CommittedReader, topic: str, timeout_s: float) -> None:
        self.c, self.reader, self.topic, self.timeout_s = consumer, reader, topic, timeout_s

    def watermarks(self, partition: int) -> tuple[int, int]:
        return self.c.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=self.timeout_s, cached=False)

    def records(self, partition: int, start: int, stop: int, limit: int) -> list[tuple[int, int]]:
        """(offset, timestamp ms) of up to `limit` committed records with start <= offset < stop;
        fewer (none) only when the rest of the range holds no committed record."""
        if start >= stop:
            return []
        self.reader.seek({partition: start})
        out: list[tuple[int, int]] = []
        deadline = time.monotonic() + self.timeout_s
        while len(out) < limit and self.reader.positions[partition] < stop:
            for msg in self.reader.poll(limit, 0.2):
                if offset_of(msg) >= stop:
                    return out
                kind, ts = msg.timestamp()
                if kind == TIMESTAMP_NOT_AVAILABLE:
                    raise HandoffError(
                        f"record {self.topic}[{partition}]@{msg.offset()} has no timestamp: the handoff needs "
                        "producers to set record timestamps (event time)"
                    )
                out.append((offset_of(msg), ts))
                if len(out) >= limit:
                    return out
            if time.monotonic() > deadline:
                raise HandoffError(
                    f"the committed records of {self.topic}[{partition}] in [{start}, {stop}) could not be read within "
                    f"{self.timeout_s:.0f}s (reached offset {self.reader.positions[partition]}; open transaction? "
                    "broker down?)"
                )
        return out

    def first_at_or_after(self, partition: int, offset: int, high: int) -> tuple[int, int] | None:
        if offset >= high:
            return None
        recs = self.records(partition, offset, high, 1)
        return recs[0] if recs else None

    def last_before(self, partition: int, offset: int, low: int) -> tuple[int, int] | None:
        stop, step = offset, _BACK_STEP
        while stop > low:
            start = max(low, stop - step)
            recs = self.records(partition, start, stop, stop - start)
            if recs:
                return recs[-1]
            stop, step = start, step * 2  # a gap (compaction, transaction markers): look further back
        return None


def _is_safe_start(r: _Reader, partition: int, offset: int, low: int, high: int, target: int) -> bool:
    if not low <= offset <= high:
        return False
    before = r.last_before(partition, offset, low)
    at = r.first_at_or_after(partition, offset, high)
    return (before is None or before[1] < target) and (at is None or at[1] >= target)


def search_start(r: _Reader, partition: int, low: int, high: int, target: int) -> int:
    """Binary search for a start offset: the record before it is < target, the one at it >= target.

    Invariant: the last record before `a` is < target (or none), the first record at or after `b`
    is >= target (or none). Each probe reads one record."""
    a, b = low, high
    while a < b:
        mid = (a + b) // 2
        rec = r.first_at_or_after(partition, mid, b)
        if rec is None or rec[1] >= target:
            b = mid
        else:
            a = rec[0] + 1
    return a


def find_handoff(
    broker: Broker,
    topic: str,
    t_handoff: datetime,
    max_lateness: timedelta | float,
    *,
    timeout_s: float = 10.0,
    offsets_for_times: OffsetsForTimes | None = None,
) -> HandoffPlan:
    """Start offset of every partition of `topic` for the handoff at `t_handoff`.

    The broker (KafkaAccess or bootstrap string) gets private consumers, closed afterwards."""
    broker = as_access(broker)
    consumer = Consumer(consumer_config(broker, group="slipstream-handoff"))
    reader = CommittedReader(broker, topic, {}, group="slipstream-handoff-records")
    try:
        return _find(consumer, _Reader(consumer, reader, topic, timeout_s), topic, target_ms(t_handoff, max_lateness),
                     timeout_s, offsets_for_times)
    except KafkaException as e:
        consumer.poll(0)  # serves the error callback: a refused login raises KafkaAuthError, naming broker and mechanism
        raise HandoffError(f"handoff offsets for topic {topic!r} could not be read from {broker}: {e}") from e
    finally:
        reader.close()
        consumer.close()


def _find(consumer: Consumer, r: _Reader, topic: str, target: int, timeout_s: float,
          oft: OffsetsForTimes | None) -> HandoffPlan:
    meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise HandoffError(f"topic {topic!r} does not exist on the broker: create it or fix data.topic")
    parts = sorted(meta.partitions)
    ask = oft or (lambda tps, timeout: consumer.offsets_for_times(tps, timeout=timeout))
    answers = {tp.partition: tp for tp in ask([TopicPartition(topic, p, target) for p in parts], timeout_s)}
    plan: dict[int, PartitionHandoff] = {}
    for p in parts:
        low, high = r.watermarks(p)
        if low >= high:
            plan[p] = PartitionHandoff(p, high, "empty")
            continue
        tp = answers.get(p)
        answer = None if tp is None or tp.error is not None else (high if tp.offset < 0 else tp.offset)
        if answer is not None and _is_safe_start(r, p, answer, low, high, target):
            plan[p] = PartitionHandoff(p, answer, "offsets_for_times", answer)
            continue
        found = search_start(r, p, low, high, target)
        if not _is_safe_start(r, p, found, low, high, target):
            raise HandoffError(
                f"{topic}[{p}]: no offset separates timestamps < {target} from >= {target} (found {found}); "
                "record timestamps are not in produce order beyond max_lateness: raise data.max_lateness_s"
            )
        log.warning(
            "%s[%d]: the broker answered offsets_for_times(%d) with %s, which is not a verified start; "
            "binary search over record timestamps found %d", topic, p, target, answer, found,
        )
        plan[p] = PartitionHandoff(p, found, "search", answer)
    log.info("handoff of %s at %d ms: %s", topic, target, {p: (h.offset, h.method) for p, h in plan.items()})
    return HandoffPlan(topic, target, plan)


def handoff_offsets(
    broker: Broker,
    topic: str,
    t_handoff: datetime,
    max_lateness: timedelta | float,
    *,
    timeout_s: float = 10.0,
    offsets_for_times: OffsetsForTimes | None = None,
) -> dict[int, int]:
    """{partition: start offset} for the stream phase: offsets_for_times(T - max_lateness),
    verified, with a binary search over record timestamps when the broker answers wrongly."""
    return find_handoff(
        broker, topic, t_handoff, max_lateness, timeout_s=timeout_s, offsets_for_times=offsets_for_times
    ).offsets
