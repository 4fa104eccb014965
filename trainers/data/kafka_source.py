"""The stream phase's reader: this rank's Kafka partitions from the handoff offsets on.

- Partitions are assigned deterministically (sorted, dealt round-robin: rank r reads
  `parts[r::world]`), by `assign`, never by a consumer group: offsets are ours, kept in the
  checkpoint, so a resume on any world size re-deals them.
- A consume call's values are decoded in one batch (`slipstream.samples.codec.decode_samples`: one Arrow
  JSON parse, or numpy views for the binary codec; no per-record dicts). Records with event_time < T are dropped and counted (the batch
  phase trained them); held-out records and the forward tail (`trainers.data.forward_tail`) are kept
  out of training; bad records go to the dead-letter topic with the reason and their origin in headers.
- `positions` is the next offset to read per partition: what a checkpoint stores (`state_dict`).
- A broker that lost records this run already read (noida-db killed -9, a broker restarted on an
  empty data dir) is detected, never skipped past: the consumer never resets its offsets by itself
  (`auto.offset.reset=error`), and a partition whose high watermark is below the run's position
  (at start, at every watermark refresh, on an out-of-range fetch) stops the run with
  `StreamDataLost` naming topic, partition and offsets. New records there would otherwise reuse
  offsets the run has passed and never be trained.
- Offsets the client passes without a record are a commit marker (one offset) or aborted
  records; a longer skip is read a second time before it is believed (`_second_look`): a
  noida-db reader that was fetching while a transaction was aborted skipped the next committed
  transaction too.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from slipstream.samples.codec import decode_samples
from slipstream.errors import HandoffError, ResumeError, StreamDataLost
from slipstream.stream.kafka import Broker, as_access, client_config, consumer_config
from trainers.data.holdout import holdout_mask
from slipstream.samples.schema import DEFAULT_SPEC
from slipstream.samples.spec import Spec
from trainers.data.rows import SOURCE_KAFKA, RowLayout, Rows
from trainers.checkpoint.stateful import check_version

log = logging.getLogger(__name__)

STATE_VERSION = 1


def _iso(us: int) -> str:
    try:
        return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).isoformat()
    except (OverflowError, ValueError, OSError):
        return f"{us} us since 1970"


def assigned_partitions(partitions: list[int], rank: int, world: int) -> list[int]:
    return sorted(partitions)[rank::world]


def topic_partitions(bootstrap: Broker, topic: str, timeout_s: float = 10.0) -> list[int]:
    c = Consumer(consumer_config(bootstrap, group="slipstream-meta"))
    try:
        meta = c.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise HandoffError(f"topic {topic!r} does not exist on {bootstrap}: create it or fix data.topic")
        return sorted(meta.partitions)
    finally:
        c.close()


@dataclass
class StreamCounters:
    fresh: int = 0
    """Records decoded with event_time >= T and not held out (handed to training)."""
    dropped_before_t: int = 0
    holdout: int = 0
    forward_tail: int = 0
    """Records of the forward tail (event time >= its start), not held out by hash: never trained."""
    dead_letters: int = 0
    records: int = 0
    newest_event_us: int = -1
    """The newest event time of a row handed to training (-1: none yet)."""
    dead_reasons: dict[str, int] = field(default_factory=dict)


class KafkaSource:
    def __init__(
        self,
        *,
        bootstrap: Broker,
        topic: str,
        dlq_topic: str,
        partitions: list[int],
        positions: dict[int, int],
        t_handoff_us: int,
        consume_batch: int,
        consume_timeout_s: float,
        lag_interval_s: float,
        group: str,
        spec: Spec = DEFAULT_SPEC,
        max_future_skew_s: float = 3600.0,
        forward_tail_start_us: int | None = None,
    ) -> None:
        self.spec, self.layout = spec, RowLayout.from_spec(spec)
        self.topic, self.dlq_topic = topic, dlq_topic
        self.bootstrap = as_access(bootstrap)
        self.partitions = list(partitions)
        self.positions = {p: int(positions[p]) for p in self.partitions}
        self.t_us = t_handoff_us
        self.tail_us = forward_tail_start_us if forward_tail_start_us is not None else np.iinfo(np.int64).max
        """Rows with event time at or after this are the forward tail: evaluated at the end, never trained."""
        self.consume_batch, self.consume_timeout_s = consume_batch, consume_timeout_s
        self.lag_interval_s = lag_interval_s
        self.max_future_us = int(max_future_skew_s * 1_000_000)
        self.dead_lettered: list[tuple[int, int, str]] = []
        """(partition, offset, sample id or "") of each dead letter since the trainer last took them
        (`take_dead_letters`): the audit accounts for them, so a dead letter is not a lost sample."""
        self.counters = StreamCounters()
        self.wait_s = 0.0
        self.idle = False
        """True when the last poll returned fewer records than asked: the rank is caught up."""
        self._high: dict[int, int] = {}
        self._high_at = 0.0
        self._unknown = False
        self._dlq: Producer | None = None
        self._second_looked: dict[int, int] = {}
        """Per partition, the end of the last skipped range read a second time (`_second_look`)."""
        # offsets are ours (checkpointed): an out-of-range position is an error, never a silent reset
        self.consumer = Consumer(consumer_config(bootstrap, group=group, **{"fetch.wait.max.ms": 50,
                                                                            "auto.offset.reset": "error"}))
        if self.partitions:
            self.lag(refresh=True)  # a broker that lost what this run read is refused before any poll
            self.consumer.assign([TopicPartition(topic, p, self.positions[p]) for p in self.partitions])

    # --- reading ----------------------------------------------------------------------------
    def poll(self, block: bool = True) -> Rows:
        """Fresh training rows from one consume call (possibly none). `block=False` only takes
        what the client already fetched (the trainer has rows buffered and must not wait)."""
        if not self.partitions:
            self.idle = True
            if block:
                time.sleep(min(self.consume_timeout_s, 0.05))
            return Rows.empty(self.layout)
        started = time.perf_counter()
        before = dict(self.positions)
        msgs = self.consumer.consume(num_messages=self.consume_batch, timeout=self.consume_timeout_s if block else 0.0)
        self.wait_s += time.perf_counter() - started
        good = [m for m in msgs if m.error() is None]
        if len(good) != len(msgs):
            for m in msgs:
                err = m.error()
                if err is None:
                    continue
                if err.fatal():
                    raise KafkaException(err)
                if err.code() == KafkaError._AUTO_OFFSET_RESET:
                    self._out_of_range(m.partition(), err.str())
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error on %s: %s (retrying)", self.topic, err)
        parts = np.asarray([m.partition() for m in good], dtype=np.int64)
        offs = np.asarray([m.offset() for m in good], dtype=np.int64)
        if not self._all_new(parts, offs):
            # a re-fetch after reconnect re-delivers records already read: keep the first reading
            keep = []
            for i, m in enumerate(good):
                p, o = int(parts[i]), int(offs[i])
                if o < self.positions.get(p, 1 << 62):
                    continue
                self.positions[p] = o + 1
                keep.append(i)
            good = [good[i] for i in keep]
            parts, offs = parts[keep], offs[keep]
        keep_mask = self._cut_at_skips(parts, offs, before)
        if keep_mask is not None:
            good = [m for m, k in zip(good, keep_mask) if k]
            parts, offs = parts[keep_mask], offs[keep_mask]
        values: list[bytes | None] = [m.value() for m in good]
        stamps = np.asarray([m.timestamp()[1] for m in good], dtype=np.int64)
        self.idle = len(msgs) < self.consume_batch and keep_mask is None
        if not values:
            return Rows.empty(self.layout)
        return self._decode(values, parts, offs, stamps, good)

    def _cut_at_skips(self, parts: np.ndarray, offs: np.ndarray, before: dict[int, int]) -> np.ndarray | None:
        """Which records to keep (None: all) when the client passed over more than a commit
        marker between two records it handed over: the batch is cut there and that range read
        again (`_second_look`)."""
        keep: np.ndarray | None = None
        for p in np.unique(parts).tolist():
            mine = np.flatnonzero(parts == p)
            o = offs[mine]
            starts = np.concatenate([[before.get(p, int(o[0]))], o[:-1] + 1])
            for i in np.flatnonzero(o - starts >= 2).tolist():
                if self._second_look(p, int(starts[i]), int(o[i])):
                    keep = np.ones(len(offs), dtype=bool) if keep is None else keep
                    keep[mine[i:]] = False
                    self.positions[p] = int(starts[i])
                    break
        return keep

    def _second_look(self, partition: int, start: int, end: int) -> bool:
        """The client skipped offsets [start, end) without handing over a record. One commit
        marker is one offset; more is aborted records, or committed records the client dropped: a
        read_committed consumer of noida-db that was fetching while a transaction was aborted (a
        joiner killed mid-transaction) skipped the next transaction's committed records too, and
        a second read of the range hands them over. So the range is read once more (seek back;
        True); skipped again, it holds nothing for us."""
        if end - start < 2 or self._second_looked.get(partition, -1) >= end:
            return False
        self._second_looked[partition] = end
        log.warning("%s[%d]: the client skipped offsets %d..%d without a record; reading them again",
                    self.topic, partition, start, end - 1)
        self.consumer.seek(TopicPartition(self.topic, partition, start))
        return True

    def _all_new(self, parts: np.ndarray, offs: np.ndarray) -> bool:
        """True (and positions advanced) when, per partition, the offsets rise strictly from at
        least the position: every record is new, as the one-by-one check would find."""
        ends: dict[int, int] = {}
        for p in np.unique(parts).tolist():
            o = offs[parts == p]
            if p not in self.positions or o[0] < self.positions[p] or (len(o) > 1 and not (np.diff(o) > 0).all()):
                return False
            ends[p] = int(o[-1]) + 1
        self.positions.update(ends)
        return True

    def _decode(self, values: list[bytes | None], parts: np.ndarray, offs: np.ndarray, stamps: np.ndarray,
                msgs: list[Any]) -> Rows:
        """Training rows of one consume call's good records; `msgs` are those records (their keys
        are read only for dead letters)."""
        c = self.counters
        c.records += len(values)
        decoded = decode_samples(values, self.spec)
        for i, reason in decoded.bad:
            self._dead_letter(values[i], msgs[i].key(), reason, int(parts[i]), int(offs[i]))
        idx = decoded.good_index
        table = decoded.table
        if table.num_rows == 0:
            return Rows.empty(self.layout)
        now_ms = int(time.time() * 1000)
        # which rows train is decided on the decoded columns, so `Rows` gathers only those rows
        event_us = pc.cast(table.column("event_time"), pa.int64()).to_numpy()
        sane = self._check_event_times(event_us, now_ms * 1000, table, values, idx, parts, offs, msgs)
        before = sane & (event_us < self.t_us)
        hold = sane & holdout_mask(table.column("sample_id"))
        tail = sane & (event_us >= self.tail_us)
        c.dropped_before_t += int(before.sum())
        c.holdout += int((hold & ~before).sum())
        c.forward_tail += int((tail & ~hold).sum())
        keep = np.flatnonzero(sane & ~before & ~hold & ~tail)
        if len(keep):  # the newest event handed to training (not the held-out or tail rows read)
            c.newest_event_us = max(c.newest_event_us, int(event_us[keep].max()))
        c.fresh += len(keep)
        return Rows.from_arrow(
            table, self.layout, source=SOURCE_KAFKA, partition=parts[idx], offset=offs[idx], record_ms=stamps[idx],
            consumed_ms=np.full(len(idx), now_ms, dtype=np.int64), take=None if len(keep) == len(idx) else keep,
        )

    def _check_event_times(self, event_us: np.ndarray, now_us: int, table: pa.Table, values: list[bytes | None],
                           idx: np.ndarray, parts: np.ndarray, offs: np.ndarray, msgs: list[Any]) -> np.ndarray:
        """Which decoded rows have a believable event time; the others become dead letters."""
        early, late = event_us < 0, event_us > now_us + self.max_future_us
        bad = np.flatnonzero(early | late)
        for j in bad.tolist():
            i = int(idx[j])
            at = _iso(int(event_us[j]))
            reason = (f"event_time out of range: {at} is before 1970-01-01" if early[j] else
                      f"event_time out of range: {at} is more than {self.max_future_us / 1e6:.0f}s after the "
                      f"consumer's clock (data.max_future_skew_s)")
            self._dead_letter(values[i], msgs[i].key(), reason, int(parts[i]), int(offs[i]),
                              sample_id=str(table.column("sample_id")[j]))
        return ~(early | late)

    def take_dead_letters(self) -> list[tuple[int, int, str]]:
        out, self.dead_lettered = self.dead_lettered, []
        return out

    def _dead_letter(self, value: bytes | None, key: bytes | None, reason: str, partition: int, offset: int,
                     sample_id: str = "") -> None:
        c = self.counters
        c.dead_letters += 1
        self.dead_lettered.append((partition, offset, sample_id))
        kind = reason.split(":")[0][:60]
        c.dead_reasons[kind] = c.dead_reasons.get(kind, 0) + 1
        if self._dlq is None:
            self._dlq = Producer(client_config(self.bootstrap, **{"enable.idempotence": True, "linger.ms": 20}))
        headers = [
            ("reason", reason.encode()),
            ("origin_topic", self.topic.encode()),
            ("origin_partition", str(partition).encode()),
            ("origin_offset", str(offset).encode()),
        ]
        while True:
            try:
                self._dlq.produce(self.dlq_topic, value=value, key=key, headers=headers)
                break
            except BufferError:
                self._dlq.poll(0.05)
        log.warning("dead letter %s[%d]@%d -> %s: %s", self.topic, partition, offset, self.dlq_topic, reason)

    def flush_dead_letters(self, timeout_s: float = 30.0) -> None:
        """Wait until every dead letter is on the broker (called before a checkpoint commits)."""
        if self._dlq is not None:
            left = self._dlq.flush(timeout_s)
            if left:
                raise HandoffError(f"{left} dead letters not delivered to {self.dlq_topic} within {timeout_s:.0f}s")

    # --- lag --------------------------------------------------------------------------------
    def lag(self, refresh: bool = False) -> int:
        """Records not yet read on this rank's partitions (high watermark - position)."""
        now = time.monotonic()
        if refresh or now - self._high_at >= self.lag_interval_s:
            self._unknown = False
            for p in self.partitions:
                try:
                    _, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=2, cached=False)
                except KafkaException as e:
                    # broker unreachable: the lag is unknown, never "caught up" (data.stop.timeout_s caps the wait)
                    self._unknown = True
                    log.warning("watermarks of %s[%d] unavailable (%s): lag unknown", self.topic, p, e)
                    continue
                self._high[p] = high
                if high < self.positions[p]:  # a fresh watermark, not one cached before records arrived
                    self._refuse_lost(p, f"its high watermark is {high}")
            self._high_at = now
        lag = sum(max(0, self._high.get(p, self.positions[p]) - self._read_up_to(p)) for p in self.partitions)
        return max(lag, 1) if self._unknown else lag

    def _read_up_to(self, partition: int) -> int:
        """Where reading `partition` stands: the next offset after the last record read, or further
        when the client skipped what holds no record for us (a transactional producer's commit
        markers, aborted records): the joiner's topic ends with a marker, never "caught up" else.
        A skip of more than a marker is read a second time first (a seek back: `_second_look`)."""
        try:
            client = self.consumer.position([TopicPartition(self.topic, partition)])[0].offset
        except KafkaException:
            client = -1
        if self._second_look(partition, self.positions[partition], client):
            return self.positions[partition]  # not caught up until the second read
        return max(self.positions[partition], client)

    def _out_of_range(self, partition: int | None, why: str) -> None:
        """The broker refused a fetch at this run's position: records lost, or deleted unread."""
        if partition in self.positions:
            try:
                low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=5, cached=False)
            except KafkaException:
                low, high = -1, -1
            if low > self.positions[partition]:
                raise StreamDataLost(
                    f"Kafka partition {self.topic}[{partition}] on {self.bootstrap} no longer holds offsets "
                    f"{self.positions[partition]}..{low - 1}, which this run has not read yet (the topic's retention "
                    "deleted them): those samples can no longer be trained. Raise the topic's retention.ms (Slipstream "
                    "creates topics with -1), and start a new run (new run.run_id)."
                )
            if 0 <= high < self.positions[partition]:
                self._refuse_lost(partition, f"its high watermark is {high}")
        self._refuse_lost(partition, f"the fetch at its position was refused ({why})")

    def _refuse_lost(self, partition: int | None, evidence: str) -> None:
        """Stop the run: the broker lost records of `partition` this run has already read."""
        p = partition if partition in self.positions else None
        where = f"{self.topic}[{p}]" if p is not None else f"{self.topic} (partitions {self.partitions})"
        at = f"this run's next offset is {self.positions[p]}" if p is not None else f"this run's positions are {self.positions}"
        raise StreamDataLost(
            f"Kafka partition {where} on {self.bootstrap} lost records this run already read: {at} but {evidence}. "
            "The broker dropped acknowledged records (a noida-db broker killed with -9 loses its last "
            "seconds of writes; a broker restarted on an empty data dir loses all), and new records would "
            "reuse offsets below the position and never be trained. Restore the topic's data and resume, "
            "or start a new run (new run.run_id) on the topic as it is now."
        )

    def close(self) -> None:
        try:
            self.flush_dead_letters(10)
        finally:
            self.consumer.close()

    def state_dict(self) -> dict[str, Any]:
        """The next offset to read of each of this rank's partitions."""
        return {"version": STATE_VERSION, "positions": {int(p): int(o) for p, o in self.positions.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's positions. Every partition this rank reads must have one:
        a partition the checkpoint does not know (the topic grew, or another topic) is refused."""
        check_version("Kafka source", state, STATE_VERSION)
        positions = {int(p): int(o) for p, o in (state.get("positions") or {}).items()}
        missing = [p for p in self.partitions if p not in positions]
        if missing:
            raise ResumeError(
                f"the checkpoint has no offset for partition(s) {missing} of {self.topic}: the topic changed since "
                "the run started (partitions added, or another topic); start a new run.run_id"
            )
        self.positions = {p: positions[p] for p in self.partitions}
        if self.partitions:
            self.consumer.assign([TopicPartition(self.topic, p, self.positions[p]) for p in self.partitions])


def read_range(bootstrap: Broker, topic: str, ranges: dict[int, tuple[int, int]], group: str,
               timeout_s: float = 30.0) -> list[tuple[list[bytes | None], np.ndarray, np.ndarray]]:
    """Values of the records in [start, stop) per partition (for evaluation after training).
    Returns one (values, partitions, offsets) tuple per consume call."""
    todo = {p: r for p, r in ranges.items() if r[1] > r[0]}
    if not todo:
        return []
    c = Consumer(consumer_config(bootstrap, group=group))
    out: list[tuple[list[bytes | None], np.ndarray, np.ndarray]] = []
    try:
        c.assign([TopicPartition(topic, p, start) for p, (start, _) in todo.items()])
        pos = {p: start for p, (start, _) in todo.items()}
        deadline = time.monotonic() + timeout_s
        while any(pos[p] < todo[p][1] for p in todo) and time.monotonic() < deadline:
            vals: list[bytes | None] = []
            ps: list[int] = []
            os_: list[int] = []
            for m in c.consume(num_messages=10_000, timeout=0.2):
                if m.error() is not None:
                    continue
                p, o = m.partition(), m.offset()
                if p not in todo or o < pos[p] or o >= todo[p][1]:
                    continue
                pos[p] = o + 1
                vals.append(m.value())
                ps.append(p)
                os_.append(o)
            if vals:
                out.append((vals, np.asarray(ps), np.asarray(os_)))
        short = {p: (pos[p], todo[p][1]) for p in todo if pos[p] < todo[p][1]}
        if short:
            log.warning("evaluation read of %s stopped short of %s after %.0fs", topic, short, timeout_s)
    finally:
        c.close()
    return out
