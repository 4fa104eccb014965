"""What was committed in a range of offsets, counted by a reader that did not do the work.

`count_committed(broker, topic, {partition: (start, stop)})` starts a fresh consumer of its own
(its own group, `read_committed`) a little before each range (`lead` offsets: a read that begins
inside a run of aborted records or right after an abort marker is the case the reader must get
through) and reads every committed record of [start, stop) with `CommittedReader`, so a broker
that drops records after an aborted transaction is read again from further back. The result is
the audit's "committed" side: what a run should have trained, held out or rejected.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaException

from slipstream.errors import StreamReadError
from slipstream.stream.committed import PROBE_WINDOW, CommittedReader, offset_of, partition_of
from slipstream.stream.kafka import Broker

if TYPE_CHECKING:
    from slipstream.samples.spec import Spec

log = logging.getLogger(__name__)


@dataclass
class CommittedCount:
    topic: str
    ranges: dict[int, tuple[int, int]]
    offsets: dict[int, np.ndarray]
    """Offsets of the committed records per partition, rising."""
    samples: pa.Table | None = None
    """With a spec: the decodable records' sample columns plus `partition` and `offset`."""
    undecodable: list[tuple[int, int, str]] = field(default_factory=list)
    """(partition, offset, reason) of committed records that are not samples of the spec."""

    @property
    def counts(self) -> dict[int, int]:
        return {p: len(o) for p, o in sorted(self.offsets.items())}

    @property
    def total(self) -> int:
        return sum(len(o) for o in self.offsets.values())


def count_committed(broker: Broker, topic: str, ranges: dict[int, tuple[int, int]], *, spec: Spec | None = None,
                    decode: bool = False, timeout_s: float = 120.0, lead: int = PROBE_WINDOW,
                    group: str | None = None) -> CommittedCount:
    """Every committed record of `topic` in [start, stop) per partition (see the module doc).
    With `decode` (or a `spec`), their values are decoded as samples of `spec` (the default spec
    when None). Raises StreamReadError naming the partitions it could not read to their stop
    within `timeout_s` (e.g. a transaction still open inside the range)."""
    todo = {int(p): (int(a), int(b)) for p, (a, b) in ranges.items() if int(b) > int(a)}
    result = CommittedCount(topic, dict(ranges), {p: np.empty(0, np.int64) for p in ranges})
    want_values = decode or spec is not None
    if not todo:
        if want_values:  # nothing to read: no samples, with the columns every reader of them expects
            result.samples, result.undecodable = _decode([], [], spec)
        return result
    reader = CommittedReader(broker, topic, {p: a for p, (a, _) in todo.items()}, lead=lead,
                             group=group or f"slipstream-count-{uuid.uuid4().hex[:8]}")
    offsets: dict[int, list[int]] = {p: [] for p in todo}
    values: list[bytes | None] = []
    where: list[tuple[int, int]] = []
    try:
        total = sum(b - a for a, b in todo.values())
        started = last_log = time.monotonic()
        deadline = started + timeout_s
        while True:
            for m in reader.poll(10_000, 0.5):
                p, o = partition_of(m), offset_of(m)
                a, b = todo[p]
                if a <= o < b:
                    offsets[p].append(o)
                    if want_values:
                        values.append(m.value())
                        where.append((p, o))
            pos = reader.positions
            short = {p: (pos[p], b) for p, (_, b) in todo.items() if pos[p] < b}
            if not short:
                break
            now = time.monotonic()
            if now > deadline:
                try:
                    ends = reader.ends()
                except KafkaException as e:  # the broker does not answer: the error says so, not a traceback
                    log.warning("committed ends of %s unavailable: %s", topic, e)
                    ends = {}
                raise StreamReadError(
                    f"counting the committed records of {topic} on {broker}: "
                    + "; ".join(f"partition {p} reached offset {at} of {b} (committed end {ends.get(p)})"
                                for p, (at, b) in sorted(short.items()))
                    + f" within {timeout_s:.0f}s. A transaction still open inside the range holds its end until "
                    "it is committed or aborted; else the broker did not hand the records over")
            if now - last_log >= 10:
                done = sum(min(pos[p], b) - a for p, (a, b) in todo.items())
                rate = done / max(now - started, 1e-9)
                log.info("counting committed records of %s: %d of %d offsets (%.0f/s, ETA %.0fs)", topic, done, total,
                         rate, (total - done) / max(rate, 1e-9))
                last_log = now
    finally:
        reader.close()
    result.offsets = {p: np.asarray(sorted(o), dtype=np.int64) for p, o in offsets.items()}
    if want_values:
        result.samples, result.undecodable = _decode(values, where, spec)
    log.info("%s: %d committed records in %s (%d re-reads, %d records recovered)", topic, result.total,
             {p: f"{a}..{b}" for p, (a, b) in sorted(todo.items())}, reader.stats.rereads, reader.stats.recovered)
    return result


def _decode(values: list[bytes | None], where: list[tuple[int, int]],
            spec: Spec | None) -> tuple[pa.Table, list[tuple[int, int, str]]]:
    from slipstream.samples.codec import decode_samples

    dec = decode_samples(values, spec)
    at = np.asarray(where, dtype=np.int64).reshape(-1, 2)
    good = at[np.asarray(dec.good_index, dtype=np.int64)] if len(at) else at
    table = dec.table.append_column("partition", pa.array(good[:, 0], pa.int32()))
    table = table.append_column("offset", pa.array(good[:, 1], pa.int64()))
    bad = [(int(at[i, 0]), int(at[i, 1]), reason) for i, reason in dec.bad]
    return table, bad
