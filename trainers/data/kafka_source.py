"""The stream phase's reader: this rank's Kafka partitions from the handoff offsets on.

- Partitions are assigned deterministically (sorted, dealt round-robin: rank r reads
  `parts[r::world]`), by `assign`, never by a consumer group: offsets are ours, kept in the
  checkpoint, so a resume on any world size re-deals them.
- Records come from `slipstream.stream.committed.CommittedReader`: every committed record once, in
  offset order per partition, also on a broker that drops records for a fetch starting after an
  aborted transaction (the embedded one): a range the client passed without a record is read again
  from further back until its records arrive or it is shown to hold none. A resume or handoff
  offset right after an abort marker is read the same way (the reader starts a little before it).
- A consume call's values are decoded in one batch (`slipstream.samples.codec.decode_samples`: one
  Arrow JSON parse, or numpy views for the binary codec; no per-record dicts). Records with
  event_time < T are dropped and counted (the batch phase trained them); held-out records and the
  forward tail (`trainers.data.forward_tail`) are kept out of training; bad records, event times
  outside [T - data.max_age_s, clock + data.max_future_skew_s] and duplicate sample ids
  (`trainers.data.dedupe`) go to the dead-letter topic with the reason and their origin in headers.
- `positions` is the next offset to read per partition: what a checkpoint stores (`state_dict`).
  `lag()` is the committed end (last stable offset) minus the position: 0 only when every
  committed record was handed over, never because the reader stopped seeing records.
- A broker that lost records this run already read (noida-db killed -9, a broker restarted on an
  empty data dir) is detected, never skipped past: the consumer never resets its offsets by itself
  (`auto.offset.reset=error`), and a partition whose high watermark is below the run's position
  (at start, at every watermark refresh, on an out-of-range fetch) stops the run with
  `StreamDataLost` naming topic, partition and offsets. New records there would otherwise reuse
  offsets the run has passed and never be trained.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from slipstream.errors import HandoffError, ResumeError, StreamDataLost, StreamReadError
from slipstream.samples.codec import decode_samples
from slipstream.samples.schema import DEFAULT_SPEC
from slipstream.samples.spec import Spec
from slipstream.stream.committed import CommittedReader, offset_of, partition_of
from slipstream.stream.kafka import Broker, as_access, client_config, consumer_config
from trainers.checkpoint.stateful import check_version
from trainers.data.dedupe import SampleIdDedupe
from trainers.data.holdout import holdout_mask
from trainers.data.rows import SOURCE_KAFKA, RowLayout, Rows

log = logging.getLogger(__name__)

STATE_VERSION = 1
DAY_S = 86_400.0
READER_OVERRIDES = {"fetch.wait.max.ms": 50, "auto.offset.reset": "error"}
"""Offsets are ours (checkpointed): an out-of-range position is an error, never a silent reset."""


def _iso(us: int) -> str:
    try:
        return datetime.fromtimestamp(us / 1e6, tz=UTC).isoformat()
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
    """Records decoded with event_time >= T, not held out, not duplicates (handed to training)."""
    dropped_before_t: int = 0
    holdout: int = 0
    forward_tail: int = 0
    """Records of the forward tail (event time >= its start), not held out by hash: never trained."""
    dead_letters: int = 0
    """Records sent to the dead-letter topic, duplicates not included."""
    duplicates: int = 0
    """Records of a sample id admitted within the dedupe horizon (dead-lettered as duplicates)."""
    records: int = 0
    newest_event_us: int = -1
    """The newest event time of a row handed to training (-1: none yet)."""
    dead_reasons: dict[str, int] = field(default_factory=dict)


Rejected = tuple[int, int, str]
"""(partition, offset, sample id or "") of a record the source refused."""


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
        max_age_s: float = 400 * DAY_S,
        dedupe: SampleIdDedupe | None = None,
    ) -> None:
        self.spec, self.layout = spec, RowLayout.from_spec(spec)
        self.topic, self.dlq_topic = topic, dlq_topic
        self.bootstrap = as_access(bootstrap)
        self.partitions = list(partitions)
        self.t_us = t_handoff_us
        self.tail_us = forward_tail_start_us if forward_tail_start_us is not None else np.iinfo(np.int64).max
        """Rows with event time at or after this are the forward tail: evaluated at the end, never trained."""
        self.consume_batch, self.consume_timeout_s = consume_batch, consume_timeout_s
        self.lag_interval_s = lag_interval_s
        self.max_future_us = int(max_future_skew_s * 1_000_000)
        self.max_age_s = max_age_s
        self.dedupe = dedupe
        self.dead_lettered: list[Rejected] = []
        """Each dead letter since the trainer last took them (`take_dead_letters`): the audit
        accounts for them, so a dead letter is not a lost sample."""
        self.duplicated: list[Rejected] = []
        """Each duplicate refused since the trainer last took them (`take_duplicates`)."""
        self.counters = StreamCounters()
        self.wait_s = 0.0
        self.idle = False
        """True when the last poll returned fewer records than asked: the rank is caught up."""
        self._lag: dict[int, int] = {}
        self._lag_at = 0.0
        self._unknown = False
        self._dlq: Producer | None = None
        self.reader = CommittedReader(self.bootstrap, topic, {p: int(positions[p]) for p in self.partitions},
                                      group=group, consumer_overrides=dict(READER_OVERRIDES), on_error=self._on_error)
        if self.partitions:
            self.lag(refresh=True)  # a broker that lost what this run read is refused before any poll

    @property
    def positions(self) -> dict[int, int]:
        """The next offset to read per partition (every offset below it handed over or holding no
        committed record)."""
        return self.reader.positions

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
        try:
            msgs = self.reader.poll(self.consume_batch, self.consume_timeout_s if block else 0.0)
        except KafkaException as e:
            raise StreamReadError(
                f"reading Kafka topic {self.topic} on {self.bootstrap} (partitions {self.partitions}, next offsets "
                f"{self.positions}) failed: {e}. Check that the broker is up and the topic exists, then resume the run "
                "with the same run.run_id: it continues from its last checkpoint") from e
        self.wait_s += time.perf_counter() - started
        self.idle = len(msgs) < self.consume_batch
        return self.rows_of(msgs)

    def rows_of(self, msgs: list[Message]) -> Rows:
        """Training rows of records the reader handed over (each once, in offset order per partition)."""
        if not msgs:
            return Rows.empty(self.layout)
        parts = np.fromiter((partition_of(m) for m in msgs), dtype=np.int64, count=len(msgs))
        offs = np.fromiter((offset_of(m) for m in msgs), dtype=np.int64, count=len(msgs))
        stamps = np.fromiter((m.timestamp()[1] for m in msgs), dtype=np.int64, count=len(msgs))
        return self._decode([m.value() for m in msgs], parts, offs, stamps, msgs)

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
        if self.dedupe is not None and len(keep):
            keep = self._drop_duplicates(keep, table, event_us, values, idx, parts, offs, msgs)
        if len(keep):  # the newest event handed to training (not the held-out, tail or duplicate rows read)
            c.newest_event_us = max(c.newest_event_us, int(event_us[keep].max()))
        c.fresh += len(keep)
        return Rows.from_arrow(
            table, self.layout, source=SOURCE_KAFKA, partition=parts[idx], offset=offs[idx], record_ms=stamps[idx],
            consumed_ms=np.full(len(idx), now_ms, dtype=np.int64), take=None if len(keep) == len(idx) else keep,
        )

    def _drop_duplicates(self, keep: np.ndarray, table: pa.Table, event_us: np.ndarray, values: list[bytes | None],
                         idx: np.ndarray, parts: np.ndarray, offs: np.ndarray, msgs: list[Any]) -> np.ndarray:
        """`keep` (decoded rows to train) less the records of a sample id admitted within the
        dedupe horizon; those become dead letters and audit rows of source `duplicate`."""
        assert self.dedupe is not None
        ids = table.column("sample_id").take(pa.array(keep)).to_pylist()
        ok = self.dedupe.admit(parts[idx][keep], ids, event_us[keep])
        if ok.all():
            return keep
        horizon = self.dedupe.horizon_us / 1e6
        for j in np.flatnonzero(~ok).tolist():
            i = int(idx[keep[j]])
            p, o = int(parts[i]), int(offs[i])
            self.counters.duplicates += 1
            self.duplicated.append((p, o, ids[j] or ""))
            self._send_dead_letter(values[i], msgs[i].key(), f"duplicate sample id {ids[j]}: a record with this id was "
                                   f"admitted within the dedupe horizon ({horizon:.0f}s, data.dedupe_horizon_s); the "
                                   "first one is trained", p, o)
        kept: np.ndarray = keep[ok]
        return kept

    def _check_event_times(self, event_us: np.ndarray, now_us: int, table: pa.Table, values: list[bytes | None],
                           idx: np.ndarray, parts: np.ndarray, offs: np.ndarray, msgs: list[Any]) -> np.ndarray:
        """Which decoded rows have a believable event time; the others become dead letters: before
        1970, more than data.max_age_s before T (1971, a 0 default, seconds read as milliseconds:
        never "dropped before T", which would claim the batch phase trained them), or more than
        data.max_future_skew_s after the consumer's clock."""
        floor = self.t_us - int(self.max_age_s * 1_000_000) if self.max_age_s > 0 else 0
        early, late = event_us < max(floor, 0), event_us > now_us + self.max_future_us
        bad = np.flatnonzero(early | late)
        for j in bad.tolist():
            i = int(idx[j])
            at = _iso(int(event_us[j]))
            if late[j]:
                reason = (f"event_time out of range: {at} is more than {self.max_future_us / 1e6:.0f}s after the "
                          "consumer's clock (data.max_future_skew_s)")
            elif event_us[j] < 0:
                reason = f"event_time out of range: {at} is before 1970-01-01"
            else:
                reason = (f"event_time out of range: {at} is {(self.t_us - int(event_us[j])) / 86_400e6:.0f} days before "
                          f"the run's T (more than data.max_age_s {self.max_age_s:g}): a broken clock, a default value "
                          "or a wrong unit?")
            self._dead_letter(values[i], msgs[i].key(), reason, int(parts[i]), int(offs[i]),
                              sample_id=str(table.column("sample_id")[j]))
        return ~(early | late)

    def take_dead_letters(self) -> list[Rejected]:
        out, self.dead_lettered = self.dead_lettered, []
        return out

    def take_duplicates(self) -> list[Rejected]:
        out, self.duplicated = self.duplicated, []
        return out

    def _dead_letter(self, value: bytes | None, key: bytes | None, reason: str, partition: int, offset: int,
                     sample_id: str = "") -> None:
        c = self.counters
        c.dead_letters += 1
        self.dead_lettered.append((partition, offset, sample_id))
        self._send_dead_letter(value, key, reason, partition, offset)

    def _send_dead_letter(self, value: bytes | None, key: bytes | None, reason: str, partition: int,
                          offset: int) -> None:
        c = self.counters
        kind = reason.split(":")[0][:60]
        c.dead_reasons[kind] = c.dead_reasons.get(kind, 0) + 1
        if self._dlq is None:
            self._dlq = Producer(client_config(self.bootstrap, **{"enable.idempotence": True, "linger.ms": 20}))
        headers: list[tuple[str, str | bytes | None]] = [
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
        """Committed records this rank has not read yet: per partition, the committed end (last
        stable offset) minus the position, refreshed every `lag_interval_s` (or when asked)."""
        now = time.monotonic()
        if refresh or now - self._lag_at >= self.lag_interval_s:
            self._unknown = False
            try:
                high = self.reader.high_watermarks()
                self._lag = self.reader.lag(refresh=True)
            except (KafkaException, FutureTimeout) as e:
                # broker unreachable: the lag is unknown, never "caught up" (data.stop.timeout_s caps the wait)
                self._unknown = True
                log.warning("watermarks of %s%s unavailable (%s): lag unknown", self.topic, self.partitions, e)
                high = {}
            positions = self.positions
            for p, h in sorted(high.items()):
                if h < positions[p]:  # a fresh watermark, not one cached before records arrived
                    self._refuse_lost(p, f"its high watermark is {h}")
            self._lag_at = now
        else:
            self._lag = self.reader.lag(refresh=False)
        lag = sum(self._lag.values())
        return max(lag, 1) if self._unknown else lag

    def stop_offsets(self) -> dict[int, int]:
        """Per partition, the committed end now (the run's stop offsets: the audit counts what was
        committed up to them); {} when the broker does not answer."""
        if not self.partitions:
            return {}
        try:
            return self.reader.ends(refresh=True)
        except (KafkaException, FutureTimeout) as e:
            log.warning("committed ends of %s%s unavailable at the stop (%s)", self.topic, self.partitions, e)
            return {}

    def _on_error(self, m: Message) -> None:
        err = m.error()
        assert err is not None
        if err.fatal():
            raise KafkaException(err)
        if err.code() == KafkaError._AUTO_OFFSET_RESET:
            self._out_of_range(m.partition(), err.str())
        log.warning("consume error on %s[%s]: %s (retrying)", self.topic, m.partition(), err)

    def _out_of_range(self, partition: int | None, why: str) -> None:
        """The broker refused a fetch at this run's position: records lost, or deleted unread."""
        positions = self.positions
        if partition in positions:
            try:
                low = self.reader.ends(low=True).get(partition, -1)
                high = self.reader.high_watermarks().get(partition, -1)
            except (KafkaException, FutureTimeout):
                low, high = -1, -1
            if low > positions[partition]:
                raise StreamDataLost(
                    f"Kafka partition {self.topic}[{partition}] on {self.bootstrap} no longer holds offsets "
                    f"{positions[partition]}..{low - 1}, which this run has not read yet (the topic's retention "
                    "deleted them): those samples can no longer be trained. Raise the topic's retention.ms (Slipstream "
                    "creates topics with -1), and start a new run (new run.run_id)."
                )
            if 0 <= high < positions[partition]:
                self._refuse_lost(partition, f"its high watermark is {high}")
        self._refuse_lost(partition, f"the fetch at its position was refused ({why})")

    def _refuse_lost(self, partition: int | None, evidence: str) -> None:
        """Stop the run: the broker lost records of `partition` this run has already read."""
        positions = self.positions
        p = partition if partition in positions else None
        where = f"{self.topic}[{p}]" if p is not None else f"{self.topic} (partitions {self.partitions})"
        at = f"this run's next offset is {positions[p]}" if p is not None else f"this run's positions are {positions}"
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
            self.reader.close()

    def state_dict(self) -> dict[str, Any]:
        """The next offset to read of each of this rank's partitions."""
        return {"version": STATE_VERSION, "positions": {int(p): int(o) for p, o in self.positions.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's positions. Every partition this rank reads must have one:
        a partition the checkpoint does not know (the topic grew, or another topic) is refused."""
        self.reader.seek(checked_positions(self.topic, self.partitions, state))


def checked_positions(topic: str, partitions: list[int], state: dict[str, Any]) -> dict[int, int]:
    """This rank's positions from a Kafka source state, refusing one that lacks a partition."""
    check_version("Kafka source", state, STATE_VERSION)
    positions = {int(p): int(o) for p, o in (state.get("positions") or {}).items()}
    missing = [p for p in partitions if p not in positions]
    if missing:
        raise ResumeError(
            f"the checkpoint has no offset for partition(s) {missing} of {topic}: the topic changed since "
            "the run started (partitions added, or another topic); start a new run.run_id"
        )
    return {p: positions[p] for p in partitions}


def read_range(bootstrap: Broker, topic: str, ranges: dict[int, tuple[int, int]], group: str,
               timeout_s: float = 30.0) -> list[tuple[list[bytes | None], np.ndarray, np.ndarray]]:
    """Values of the committed records in [start, stop) per partition (for evaluation after
    training), read through aborted transactions (`CommittedReader`). Returns one (values,
    partitions, offsets) tuple per consume call."""
    todo = {p: r for p, r in ranges.items() if r[1] > r[0]}
    if not todo:
        return []
    reader = CommittedReader(bootstrap, topic, {p: start for p, (start, _) in todo.items()}, group=group)
    out: list[tuple[list[bytes | None], np.ndarray, np.ndarray]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while any(reader.positions[p] < todo[p][1] for p in todo) and time.monotonic() < deadline:
            msgs = [m for m in reader.poll(10_000, 0.2) if offset_of(m) < todo[partition_of(m)][1]]
            if msgs:
                out.append(([m.value() for m in msgs], np.asarray([partition_of(m) for m in msgs]),
                            np.asarray([offset_of(m) for m in msgs])))
        pos = reader.positions
        short = {p: (pos[p], todo[p][1]) for p in todo if pos[p] < todo[p][1]}
        if short:
            log.warning("evaluation read of %s stopped short of %s after %.0fs", topic, short, timeout_s)
    finally:
        reader.close()
    return out
