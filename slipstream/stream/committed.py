"""Reading the committed records of a topic's partitions, exactly once and without a silent skip,
on a real Kafka broker and on brokers that lose records after an aborted transaction.

A `read_committed` consumer hands over committed records and silently passes the offsets that
hold none for it: one commit marker at the end of each transaction, the records of aborted
transactions and their abort marker. A correct broker never makes it pass a committed record.
The embedded broker (noida-db 0.2.3) does: a fetch that starts after a producer's abort marker
drops every later record of that producer (the broker sends the old aborted transaction along,
and the client, which never meets its marker in that response, takes the producer's committed
records for aborted ones). A fetch that starts before the aborted transaction reads through it,
so the same records come back when read again from further back.

`CommittedReader` keeps its own position per partition: every offset below it was handed over
or shown to hold no committed record. It starts reading `lead` offsets before the positions it
is given (what it reads there is remembered, not handed over), so a gap at the start is verified
like any other. Where the client passed two or more offsets without a
record (one is a commit marker), the reader reads the range again with a second consumer from a
little before it (`probe_window` offsets), backing off (doubling) until the range's committed
records arrive (they are handed over in offset order, before the records after them), or until a
read shows the range holds none: a read that starts at the partition's first offset, or one that
hands over exactly the records already read before the range, at least one (a read that starts
after an aborted transaction of a producer drops that producer's records before the range too).
A partition where a read from further back found records that the client had passed re-reads
from that offset the next time (the broker keeps dropping that producer's records for fetches
that start after its abort), which costs the records since then per re-read: on the embedded
broker a topic with an aborted transaction is read at a cost that grows with the records after
it; a real Kafka broker never needs that.

API (`positions` in, records out)::

    reader = CommittedReader(broker, topic, {partition: next_offset, ...}, group="my-reader")
    msgs = reader.poll(max_records=1000, timeout_s=0.5)   # confluent_kafka Messages, no errors
    reader.positions       # {partition: next offset}; what a checkpoint stores
    reader.lag()           # {partition: committed end (last stable offset) - position}
    reader.seek({p: o})    # continue elsewhere (a resume); partitions not named are dropped
    reader.close()

Every message `poll` returns has an offset >= the position of its partition before the call, and
offsets rise per partition across calls: never a duplicate, never a gap that was not verified.
`lag()` is 0 only when every committed record below the committed end was handed over.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]  # confluent_kafka.admin re-exports it without __all__

from slipstream.errors import StreamReadError
from slipstream.stream.kafka import Broker, as_access, client_config, consumer_config

log = logging.getLogger(__name__)

PROBE_WINDOW = 256
"""Offsets before a gap that its first re-read starts at (doubled at each step back)."""
HISTORY = 8192
"""Offsets of the last records handed over, per partition: what a re-read must hand over again
before its verdict "no committed record in the gap" is believed."""

ErrorHandler = Callable[[Message], None]


def offset_of(m: Message) -> int:
    """The offset of a consumed record (set on every record without an error)."""
    o = m.offset()
    assert o is not None
    return o


def partition_of(m: Message) -> int:
    p = m.partition()
    assert p is not None
    return p


@dataclass
class ReaderStats:
    rereads: int = 0
    """Re-reads made (each back-off step is one)."""
    reread_records: int = 0
    """Records read again by them (before the gap, discarded)."""
    recovered: int = 0
    """Committed records the client had passed without handing them over, found by a re-read."""
    gaps_verified: int = 0
    """Ranges of two or more offsets shown to hold no committed record (aborted transactions)."""


@dataclass
class _Partition:
    position: int
    history: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY))
    known_from: int = 0
    """History holds every record handed over from this offset to the position."""
    origin: int | None = None
    """Where the last re-read that found passed records started: the next one starts there."""
    warm_until: int = 0
    """Records below this (read from `known_from`, before the start) only fill the history."""

    def handed(self, offset: int) -> None:
        self.took([offset])

    def took(self, offsets: list[int]) -> None:
        """Records at `offsets` (rising, all >= position) were handed over."""
        self.history.extend(offsets)
        if len(self.history) == self.history.maxlen:
            self.known_from = max(self.known_from, self.history[0])
        self.position = offsets[-1] + 1

    def warm(self, offset: int) -> None:
        """A record before the start position: evidence for re-reads, never handed over."""
        if self.known_from <= offset < self.warm_until and (not self.history or offset > self.history[-1]):
            self.history.append(offset)

    def known(self, start: int) -> list[int]:
        """Offsets handed over in [start, position), when the history reaches back to start."""
        return [o for o in self.history if o >= start]


class CommittedReader:
    """The committed records of `partitions` of `topic` from given positions; see the module doc."""

    def __init__(self, broker: Broker, topic: str, positions: dict[int, int], *, group: str = "slipstream-committed",
                 consumer_overrides: dict[str, Any] | None = None, on_error: ErrorHandler | None = None,
                 probe_window: int = PROBE_WINDOW, reread_timeout_s: float = 30.0,
                 check_interval_s: float = 0.2, lead: int = PROBE_WINDOW) -> None:
        self.broker, self.topic = as_access(broker), topic
        self.group = group
        self.on_error = on_error or self._default_error
        self.probe_window = max(2, int(probe_window))
        self.reread_timeout_s = reread_timeout_s
        self.check_interval_s = check_interval_s
        self.lead = max(0, int(lead))
        self.stats = ReaderStats()
        self.consumer = Consumer(consumer_config(broker, group=group, **(consumer_overrides or {})))
        self._probe: Consumer | None = None
        self._admin: AdminClient | None = None
        self._parts: dict[int, _Partition] = {}
        self._checked = 0.0
        self._ends: dict[int, int] = {}
        self.seek(positions)

    # --- positions --------------------------------------------------------------------------
    @property
    def positions(self) -> dict[int, int]:
        return {p: s.position for p, s in sorted(self._parts.items())}

    @property
    def partitions(self) -> list[int]:
        return sorted(self._parts)

    def seek(self, positions: dict[int, int]) -> None:
        """Read `positions` ({partition: next offset}) from now on; other partitions are dropped.
        The consumer starts `lead` offsets earlier: what it reads there is never handed over, only
        remembered, so that a gap right at the start is verified by one short re-read."""
        self._parts = {int(p): _Partition(int(o), known_from=int(o), warm_until=int(o)) for p, o in positions.items()}
        self._ends = {}
        if self.lead and self._parts:
            try:
                low = self.ends(low=True)
            except KafkaException as e:  # e.g. the topic does not exist yet: nothing before the start
                log.debug("no lead before the positions of %s: %s", self.topic, e)
                low = {p: s.position for p, s in self._parts.items()}
            for p, state in self._parts.items():
                state.known_from = min(state.position, max(low.get(p, 0), state.position - self.lead))
        self.consumer.assign([TopicPartition(self.topic, p, s.known_from) for p, s in sorted(self._parts.items())])

    # --- reading ----------------------------------------------------------------------------
    def poll(self, max_records: int, timeout_s: float) -> list[Message]:
        """Up to about `max_records` committed records (more when a re-read recovers some), in
        offset order per partition; waits up to `timeout_s` for the first."""
        if not self._parts:
            if timeout_s > 0:
                time.sleep(min(timeout_s, 0.05))
            return []
        good: list[Message] = []
        for m in self.consumer.consume(num_messages=max_records, timeout=timeout_s):
            err = m.error()
            if err is None:
                good.append(m)
            elif err.code() != KafkaError._PARTITION_EOF:
                self.on_error(m)
        out = self._in_order(good) if good else good
        if len(out) < max_records:
            self._check_passed(out)
        return out

    def _in_order(self, msgs: list[Message]) -> list[Message]:
        """The new records of one consume call, each gap of two or more offsets verified first."""
        parts = np.fromiter((partition_of(m) for m in msgs), dtype=np.int64, count=len(msgs))
        offs = np.fromiter((offset_of(m) for m in msgs), dtype=np.int64, count=len(msgs))
        plain: dict[int, np.ndarray] = {}
        for p in np.unique(parts).tolist():
            state = self._parts.get(p)
            o = offs[parts == p]
            # the usual case: rising from the position, at most one commit marker between records
            if state is None or not (0 <= o[0] - state.position <= 1 and (len(o) < 2 or bool(((d := np.diff(o)) >= 1).all()
                                                                                             and (d <= 2).all()))):
                break
            plain[p] = o
        else:
            for p, o in plain.items():
                self._parts[p].took(o.tolist())
            return msgs
        out: list[Message] = []
        for m in msgs:
            state = self._parts.get(partition_of(m))
            if state is None:
                continue
            o = offset_of(m)
            if o < state.position:
                state.warm(o)  # read before the start (or again after a reconnect: already handed over)
                continue
            if o - state.position >= 2:
                out.extend(self._verify(partition_of(m), state, o))
            state.handed(o)
            out.append(m)
        return out

    def _check_passed(self, out: list[Message]) -> None:
        """Partitions whose client position passed two or more offsets beyond ours without a
        record (nothing arrives while the committed end says there is more): verify them."""
        now = time.monotonic()
        if now - self._checked < self.check_interval_s:
            return
        self._checked = now
        tps = [TopicPartition(self.topic, p) for p in self._parts]
        try:
            client = {tp.partition: tp.offset for tp in self.consumer.position(tps)}
        except KafkaException as e:
            log.warning("positions of %s unavailable (%s)", self.topic, e)
            return
        for p, state in self._parts.items():
            passed = client.get(p, -1)
            if passed - state.position == 1:
                state.position = passed  # a commit marker
            elif passed - state.position >= 2:
                out.extend(self._verify(p, state, passed))
                state.position = max(state.position, passed)

    def _verify(self, p: int, state: _Partition, end: int) -> list[Message]:
        """Records of [position, end) the client passed: re-read from further back until they
        arrive or a read shows there are none. Returns them in offset order (position advanced)."""
        gap = state.position
        low = self.ends(refresh=False, low=True).get(p, 0)
        step = self.probe_window
        start = max(low, gap - step if state.origin is None else min(state.origin, gap - step))
        while True:
            found, before = self._reread(p, start, gap, end)
            if found:
                self.stats.recovered += len(found)
                state.origin = start if state.origin is None else min(state.origin, start)
                log.warning("%s[%d]: the client passed committed offsets in %d..%d without handing them over; "
                            "%d found by reading again from %d (the broker drops a producer's records for fetches "
                            "that start after its aborted transaction)", self.topic, p, gap, end - 1, len(found), start)
                for m in found:
                    state.handed(offset_of(m))
                return found
            known = state.known(max(start, state.known_from))
            if start <= low or (known and [o for o in before if o >= state.known_from] == known):
                self.stats.gaps_verified += 1
                log.info("%s[%d]: offsets %d..%d hold no committed record (aborted transaction; read again from %d)",
                         self.topic, p, gap, end - 1, start)
                return []
            step *= 2
            start = max(low, gap - step)

    def _reread(self, p: int, start: int, gap: int, end: int) -> tuple[list[Message], list[int]]:
        """One read of [start, end) by the probe consumer: (records in [gap, end), offsets of
        those in [start, gap))."""
        if self._probe is None:
            self._probe = Consumer(consumer_config(self.broker, group=f"{self.group}-reread"))
        tp = TopicPartition(self.topic, p, start)
        self._probe.assign([tp])
        self.stats.rereads += 1
        found: list[Message] = []
        before: list[int] = []
        deadline = time.monotonic() + self.reread_timeout_s
        while True:
            for m in self._probe.consume(num_messages=10_000, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        self.on_error(m)
                    continue
                o = offset_of(m)
                if o < gap:
                    before.append(o)
                    self.stats.reread_records += 1
                elif o < end:
                    found.append(m)
            passed = self._probe.position([TopicPartition(self.topic, p)])[0].offset
            if passed >= end:
                found.sort(key=offset_of)
                return found, sorted(set(before))
            if time.monotonic() > deadline:
                raise StreamReadError(
                    f"Kafka partition {self.topic}[{p}] on {self.broker}: offsets {gap}..{end - 1} were passed by "
                    f"the client without a record, and reading them again from {start} did not get past offset "
                    f"{max(passed, start)} within {self.reread_timeout_s:.0f}s; their committed records (if any) "
                    "cannot be verified. Is the broker up? An open transaction of a producer that died holds them "
                    "until the broker aborts it (transaction.timeout.ms)."
                )

    # --- where the partitions end -------------------------------------------------------------
    def ends(self, refresh: bool = True, low: bool = False) -> dict[int, int]:
        """Per partition, the committed end (last stable offset: below it every transaction is
        decided), or with `low` the first offset the broker still holds."""
        if low:
            return self._list_offsets(OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED)  # type: ignore[no-untyped-call]  # confluent_kafka leaves OffsetSpec.earliest/latest unannotated
        if refresh or not self._ends:
            self._ends = self._list_offsets(OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)  # type: ignore[no-untyped-call]  # confluent_kafka leaves OffsetSpec.earliest/latest unannotated
        return dict(self._ends)

    def high_watermarks(self) -> dict[int, int]:
        """Per partition, the end of the log (committed or not)."""
        return self._list_offsets(OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED)  # type: ignore[no-untyped-call]  # confluent_kafka leaves OffsetSpec.earliest/latest unannotated

    def _list_offsets(self, spec: OffsetSpec, isolation: IsolationLevel, timeout_s: float = 10.0) -> dict[int, int]:
        if not self._parts:
            return {}
        if self._admin is None:
            self._admin = AdminClient(client_config(self.broker))
        asked = {TopicPartition(self.topic, p): spec for p in self._parts}
        futures = self._admin.list_offsets(asked, isolation_level=isolation, request_timeout=timeout_s)
        try:
            return {tp.partition: int(f.result(timeout=timeout_s).offset) for tp, f in futures.items()}
        except TimeoutError:  # no answer at all (the broker is down): a Kafka error like any other
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no offsets of {self.topic} from {self.broker} "
                                            f"within {timeout_s:.0f}s")) from None

    def lag(self, refresh: bool = True) -> dict[int, int]:
        """Per partition, committed end - position: 0 when every committed record there was handed
        over. A position inside a trailing run of markers or aborted records counts until the
        reader has passed it (a poll checks it)."""
        ends = self.ends(refresh=refresh)
        return {p: max(0, ends.get(p, s.position) - s.position) for p, s in sorted(self._parts.items())}

    # --- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        for c in (self.consumer, self._probe):
            if c is not None:
                try:
                    c.close()
                except RuntimeError:  # already closed
                    pass
        self._probe = None

    def _default_error(self, m: Message) -> None:
        err = m.error()
        assert err is not None
        if err.fatal() or err.code() == KafkaError._AUTO_OFFSET_RESET:
            raise KafkaException(err)
        log.warning("consume error on %s[%s]: %s (retrying)", self.topic, m.partition(), err)

    def __enter__(self) -> CommittedReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
