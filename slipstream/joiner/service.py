"""The joiner's loop: consume impressions and clicks, join them per task by event time, featurise
the closed windows with the spec's Arrow featurizer, produce samples, and commit output, dead
letters, state changes and input offsets in one Kafka transaction.

A task is partition p of both input topics (they must be co-partitioned: keyed by user, the same
partition count), so a group of joiners splits the work by partition (range assignment) and a
user's impressions, clicks and sequence stay on one task. A task's watermark is the smallest
newest event time among its inputs that still have records to read, less `lateness_s`; it never
goes back. An input stops holding it back only when it is idle by its end offset
(`slipstream.joiner.idleness`), so a backlog replayed on both inputs (after an outage or a
restart) joins what a live run joins, however the client interleaves the two.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from slipstream.errors import StackError
from slipstream.joiner.config import JoinerConfig
from slipstream.joiner.events import US_PER_S, out_of_range, parse_records
from slipstream.joiner.idleness import InputActivity
from slipstream.joiner.metrics import JoinerMetrics, serve_health
from slipstream.joiner.side_tables import SideTables
from slipstream.joiner.state_store import encode_changes, encode_table, read_changelog, table_kind
from slipstream.joiner.window import NO_TIME, Closed, TaskState
from slipstream.samples.codec import encode_samples
from slipstream.samples.spec import LABEL, SAMPLE_ID, Spec
from slipstream.samples.transform import Featurizer, KeyedSequenceState, sample_ids
from slipstream.stream.kafka import Broker, client_config, consumer_config, create_topic

log = logging.getLogger(__name__)

ROWS, SEQ = "impressions", "sequence:"
"""Kinds of the changelog's Arrow records: a task's new impressions, a sequence feature's tails."""
LAG_EVERY_S = 5.0
REPORT_EVERY_S = 10.0



@dataclass
class Task:
    state: TaskState
    featurizer: Featurizer
    written_watermark: int = NO_TIME


class Joiner:
    """One replica. `run()` until `stop` is set (SIGTERM in the CLI): the open transaction is
    committed and the group left before it returns."""

    def __init__(self, cfg: JoinerConfig, spec: Spec, broker: Broker, tables: dict[str, pa.Table] | None = None) -> None:
        self.cfg, self.spec, self.broker = cfg, spec, broker
        self.tables = dict(tables or {})
        self.side: SideTables | None = None
        """The spec's side tables read from their topics (None: `tables` were given, or none yet)."""
        labels = spec.label_source
        assert labels is not None  # JoinerConfig.for_spec refuses other labels
        self.events, self.labels = spec.events, labels
        self.window_us = spec.label.window_s * US_PER_S
        self.lateness_us = int(cfg.lateness_s * US_PER_S)
        self.sort_field = next((f.per for f in spec.features if f.kind == "sequence"), None)
        self.tasks: dict[int, Task] = {}
        self.positions: dict[tuple[str, int], int] = {}
        self.stream_time: dict[tuple[str, int], int] = {}
        self.activity = InputActivity(cfg.input_idle_s, self._at_end_offset)
        self._eof_at: dict[tuple[str, int], int] = {}
        """Which input partitions are idle (no longer hold their task's watermark back)."""
        self.idle_since: dict[int, float] = {}
        self.metrics = JoinerMetrics()
        self.stop = threading.Event()
        self._txn_open = False
        self._txn_started = 0.0
        self._closes_us: list[np.ndarray] = []
        self._last_lag = self._last_report = 0.0
        self._reported = 0

    # --- lifecycle ----------------------------------------------------------------------------
    def ensure_topics(self) -> int:
        """Create what is missing; check that the inputs are co-partitioned. Returns the partitions."""
        c = self.cfg
        for topic in (c.impressions_topic, c.clicks_topic):
            create_topic(self.broker, topic, c.partitions)
        parts = self._partitions(c.impressions_topic), self._partitions(c.clicks_topic)
        if parts[0] != parts[1]:
            raise StackError(f"{c.impressions_topic} has {parts[0]} partitions and {c.clicks_topic} {parts[1]}: the "
                             "joiner needs them co-partitioned (same count, both keyed by user)")
        for topic in (c.samples_topic, c.dlq(c.impressions_topic), c.dlq(c.clicks_topic)):
            create_topic(self.broker, topic, c.partitions)
        create_topic(self.broker, c.state_topic, parts[0])
        return parts[0]

    def _partitions(self, topic: str) -> int:
        from confluent_kafka.admin import AdminClient

        md = AdminClient(client_config(self.broker)).list_topics(topic, timeout=10)
        return len(md.topics[topic].partitions)

    def run(self) -> None:
        c = self.cfg
        # pyarrow imports pandas the first time it builds an array from Python or numpy data
        # (0.3-0.8 s here): at start-up, not inside the first batch's transaction
        pa.array(np.zeros(1))
        self.ensure_topics()
        if self.spec.tables and not self.tables:  # side tables: read whole before the first window closes
            self.side = SideTables(self.spec, self.broker, partitions=c.partitions)
            self.tables.update(self.side.load())
            self._count_side()
        self.producer = Producer(client_config(self.broker, **{
            "transactional.id": f"{c.group}-{c.instance}", "enable.idempotence": True, "linger.ms": 5,
            "compression.type": "lz4", "transaction.timeout.ms": 60_000, "message.max.bytes": 16_000_000}))
        self.producer.init_transactions(60)  # fences an older self with this id, aborting what it left open
        self.consumer = Consumer(consumer_config(self.broker, group=c.group, **{
            "enable.partition.eof": True, "partition.assignment.strategy": "range", "fetch.wait.max.ms": 50,
            # static membership: a restarted replica takes its partitions back at once, without
            # waiting for the group to notice that its previous self died
            "group.instance.id": c.instance}))
        self.consumer.subscribe([c.impressions_topic, c.clicks_topic], on_assign=self._assigned,
                                on_revoke=self._revoked, on_lost=self._lost)
        health = serve_health(self.metrics, c.health_port) if c.health_port else None
        log.info("joiner %s/%s: %s + %s -> %s (window %ds, lateness %.0fs)", c.group, c.instance, c.impressions_topic,
                 c.clicks_topic, c.samples_topic, self.spec.label.window_s, c.lateness_s)
        try:
            while not self.stop.is_set():
                self.step()
            self.commit()
            log.info("joiner stopping: last transaction committed, leaving the group")
        except BaseException:
            self.metrics.healthy = False
            raise
        finally:
            self.consumer.close()
            if self.side is not None:
                self.side.close()
            if health is not None:
                health.shutdown()

    def step(self) -> None:
        """One round: take a batch, close what the watermark passes, commit when it is time."""
        if self.side is not None and self.side.poll():  # a side table changed: features join its new rows
            self.tables.update(self.side.tables)
            for task in self.tasks.values():
                task.featurizer.tables.update(self.side.tables)
            self._count_side()
        msgs = self.consumer.consume(self.cfg.batch, timeout=0.05)
        if msgs:
            self._begin()
            self._take(msgs)
        self._close_windows()
        now = time.monotonic()
        if self._txn_open and now - self._txn_started >= self.cfg.commit_interval_s:
            self.commit()
        elif not self._txn_open:
            self.metrics.last_commit = now  # nothing waits for a commit: as fresh as a commit (health)
        if now - self._last_lag >= LAG_EVERY_S:
            self._update_lag()
        if now - self._last_report >= REPORT_EVERY_S:
            self._report(now)

    def _count_side(self) -> None:
        assert self.side is not None
        with self.metrics.lock:
            self.metrics.counts["side_table_rows"] = sum(t.num_rows for t in self.side.tables.values())
            self.metrics.counts["side_table_skipped"] = self.side.bad

    # --- input --------------------------------------------------------------------------------
    def _take(self, msgs: list[Message]) -> None:
        by_input: dict[tuple[str, int], list[Message]] = {}
        now = time.monotonic()
        for m in msgs:  # in order: an end of partition after a partition's records counts, one before does not
            err = m.error()
            tp = cast(tuple[str, int], (m.topic(), m.partition()))  # records and partition ends name both
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.activity.end(tp, now)
                    self._eof_at[tp] = m.offset() or 0  # where the client stood, also before its first record
                    continue
                if err.fatal():
                    raise KafkaException(err)
                log.warning("consume error on %s[%s]: %s (retrying)", m.topic(), m.partition(), err)
                continue
            self.activity.records(tp, now)
            by_input.setdefault(tp, []).append(m)
        # impressions first: a click in the same batch as its impression joins it (as an orphan would)
        for tp, group in sorted(by_input.items(), key=lambda kv: kv[0][0] == self.cfg.clicks_topic):
            self.positions[tp] = cast(int, group[-1].offset()) + 1  # a consumed record has its offset
            self._take_input(self.tasks[tp[1]], tp, group)

    def _take_input(self, task: Task, tp: tuple[str, int], msgs: list[Message]) -> None:
        """One input partition's records of this batch: parsed in one Arrow call, checked against
        the clock, joined; each record the join cannot use goes to the dead letters with its reason."""
        is_click = tp[0] == self.cfg.clicks_topic
        source = self.labels if is_click else self.events
        rows, ts, bad = parse_records([m.value() or b"" for m in msgs], source)
        for i, reason in bad:
            self._dead(msgs[i], reason)
        if bad:
            failed = {i for i, _ in bad}
            msgs = [m for i, m in enumerate(msgs) if i not in failed]
        wrong = out_of_range(ts, int(time.time() * US_PER_S), self.cfg.max_future_s, self.cfg.max_age_s,
                             "click" if is_click else "impression")
        if wrong:
            for i, reason in wrong:
                self._dead(msgs[i], reason)
            ok = np.ones(len(ts), dtype=bool)
            ok[[i for i, _ in wrong]] = False
            msgs = [m for m, keep in zip(msgs, ok.tolist()) if keep]
            rows, ts = rows.filter(pa.array(ok)), ts[ok]
        if not len(ts):
            return
        self.stream_time[tp] = max(self.stream_time.get(tp, NO_TIME), int(ts.max()))
        if is_click:
            keys = pc.cast(rows.column(self.labels.key or ""), pa.string()).to_pylist()
            rejected = [(i, r) for i, (k, t, m) in enumerate(zip(keys, ts.tolist(), msgs))
                        if (r := task.state.click(k, t, m.value() or b"")) is not None]
        else:
            ids = sample_ids(self.spec, rows)
            rejected = task.state.impressions(ids.to_pylist(), ts, rows.append_column(SAMPLE_ID, ids))
        for i, reason in rejected:
            self._dead(msgs[i], reason)
        self.metrics.counts["clicks" if is_click else "impressions"] += len(ts) - len(rejected)

    def _dead(self, m: Message, reason: str) -> None:
        topic = cast(str, m.topic())  # a consumed record names its topic
        headers = [("reason", reason.encode()), ("source_topic", topic.encode()),
                   ("source_partition", str(m.partition()).encode()), ("source_offset", str(m.offset()).encode())]
        self._produce(self.cfg.dlq(topic), m.value(), m.key(), headers=headers)
        self.metrics.dead(reason)

    def _produce(self, topic: str, value: bytes | None, key: bytes | None, **kw: Any) -> None:
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, **kw)
                return
            except BufferError:
                self.producer.poll(0.05)

    # --- windows ------------------------------------------------------------------------------
    def _watermark(self, p: int) -> int:
        inputs = [(self.cfg.impressions_topic, p), (self.cfg.clicks_topic, p)]
        now = time.monotonic()
        reading = [self.stream_time.get(tp, NO_TIME) for tp in inputs if not self.activity.idle(tp, inputs, now)]
        newest = max(self.stream_time.get(tp, NO_TIME) for tp in inputs)
        if reading:
            self.idle_since.pop(p, None)
            return min(reading) - self.lateness_us if min(reading) > NO_TIME else NO_TIME
        idle = now - self.idle_since.setdefault(p, now)
        if newest == NO_TIME:
            return NO_TIME
        if self.cfg.idle_flush_s > 0 and idle >= self.cfg.idle_flush_s:
            return newest + self.window_us + 1  # the input is finished: close every window
        if self.cfg.idle_flush_s <= 0 and idle >= max(self.cfg.lateness_s, 1.0):
            return max(newest, int(time.time() * US_PER_S)) - self.lateness_us  # live: event time is the clock's
        return newest - self.lateness_us

    def _at_end_offset(self, tp: tuple[str, int]) -> bool | None:
        """A fresh look at input `tp`'s end offset: True when the client's position is there."""
        tpart = TopicPartition(tp[0], tp[1])
        try:
            _, high = self.consumer.get_watermark_offsets(tpart, timeout=2, cached=False)
            position = self.consumer.position([tpart])[0].offset
        except KafkaException as e:
            log.warning("end offset of %s[%d] unavailable (%s): it holds the watermark", tp[0], tp[1], e)
            return None
        # a partition handed over at its end has no client position until a record comes: its end of partition's
        return bool(max(position, self._eof_at.get(tp, -1), self.positions.get(tp, -1)) >= high)

    def _close_windows(self) -> None:
        for p, task in self.tasks.items():
            closed, rejected = task.state.advance(self._watermark(p))
            if rejected:
                self._begin()
                for r in rejected:
                    self._produce(self.cfg.dlq(self.cfg.clicks_topic), r.raw, None,
                                  headers=[("reason", r.reason.encode()), ("source_topic", self.cfg.clicks_topic.encode())])
                    self.metrics.dead(r.reason)
            if closed is not None:
                self._begin()
                self._emit(task, closed)
        self.metrics.watermark_us = max((t.state.watermark_us for t in self.tasks.values()), default=0)

    def _emit(self, task: Task, closed: Closed) -> None:
        """Featurise closed impressions (sorted as the spec's sequences need) and produce them."""
        order_by = [self.events.time or "", SAMPLE_ID]
        if self.sort_field:
            order_by.insert(0, self.sort_field)
        events = closed.rows.append_column(LABEL, pa.array(closed.label, pa.int32()))
        order = pc.sort_indices(events, sort_keys=[(name, "ascending") for name in order_by])
        samples = task.featurizer.samples(events.take(order))
        values = encode_samples(samples, self.cfg.codec, self.spec)
        keys = pc.cast(pc.cast(samples.column(self.spec.key_column), pa.string()), pa.binary()).to_pylist()
        ts_us = closed.ts_us[order.to_numpy()]
        topic, produce = self.cfg.samples_topic, self.producer.produce
        for k, v, t in zip(keys, values, (ts_us // 1000).tolist()):
            try:
                produce(topic, value=v, key=k, timestamp=t)
            except BufferError:
                self._produce(topic, v, k, timestamp=t)
        self.metrics.counts["samples"] += len(ts_us)
        self.metrics.counts["positives"] += int(closed.label.sum())
        self.metrics.counts["clicks_outside_window"] += closed.late_clicks
        self._closes_us.append(ts_us + self.window_us)

    # --- transactions -------------------------------------------------------------------------
    def _begin(self) -> None:
        if not self._txn_open:
            self.producer.begin_transaction()
            self._txn_open, self._txn_started = True, time.monotonic()

    def commit(self) -> None:
        """Changelog records, input offsets and everything produced since `_begin`, atomically."""
        if not self._txn_open:
            return
        for p, task in self.tasks.items():
            self._write_changes(p, task)
        offsets = [TopicPartition(t, p, o) for (t, p), o in self.positions.items()]
        if offsets:
            self.producer.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata(), 60)
        try:
            self.producer.commit_transaction(60)
        except KafkaException as e:
            if e.args[0].txn_requires_abort():
                self.producer.abort_transaction(60)
            raise StackError(f"the joiner's transaction failed ({e}); restart it: it resumes from its last commit") from e
        now_s = time.time()
        self._txn_open = False
        self.metrics.counts["transactions"] += 1
        self.metrics.last_commit = time.monotonic()
        if self._closes_us:
            closes = np.concatenate(self._closes_us)
            self.metrics.add_latencies(now_s - closes / US_PER_S)
            self.metrics.counts["samples_committed"] += len(closes)
            self._closes_us = []

    def _write_changes(self, p: int, task: Task) -> None:
        rows, changes = task.state.changes()
        tables = [(rows, ROWS)] if rows is not None else []
        for name, seq in task.featurizer.sequences.items():
            if isinstance(seq, KeyedSequenceState) and seq.changed:
                tables.append((seq.take_changes(), f"{SEQ}{name}"))
        empty = not tables and all(not v for k, v in changes.items() if k != "watermark")
        if empty and changes["watermark"] == task.written_watermark:
            return
        for value in [*(v for t, kind in tables for v in encode_table(t, kind)), *encode_changes(changes)]:
            self._produce(self.cfg.state_topic, value, b"changes", partition=p)
        task.written_watermark = changes["watermark"]

    # --- partitions ---------------------------------------------------------------------------
    def _assigned(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        log.info("joiner: tasks %s assigned", sorted({tp.partition for tp in parts}))
        for p in sorted({tp.partition for tp in parts}):
            if p not in self.tasks:
                self.tasks[p] = task = self._restore(p)
                if task.state.watermark_us > NO_TIME:  # the stream time that watermark came from
                    for topic in (self.cfg.impressions_topic, self.cfg.clicks_topic):
                        self.stream_time[(topic, p)] = task.state.watermark_us + self.lateness_us

    def _restore(self, p: int) -> Task:
        state = TaskState(self.window_us)
        featurizer = Featurizer(self.spec, self.tables, keyed=True)
        n = 0
        started = time.monotonic()
        for delta in read_changelog(self.broker, self.cfg.state_topic, p, f"{self.cfg.group}.restore"):
            n += 1
            if isinstance(delta, dict) and any(k in ("pending", "done") or k.startswith("seq:") for k in delta):
                raise StackError(f"{self.cfg.state_topic}[{p}] holds state in the joiner's first format (JSON rows): "
                                 "drain it with the joiner version that wrote it, or delete the state topic and "
                                 "the group's offsets to join the inputs again from their start")
            if isinstance(delta, dict):
                state.apply(delta)
                continue
            kind = table_kind(delta)
            seq = featurizer.sequences.get(kind[len(SEQ):]) if kind.startswith(SEQ) else None
            if kind == ROWS:
                state.apply_rows(delta)
            elif isinstance(seq, KeyedSequenceState):
                seq.load(delta)
        self.metrics.counts["restored_records"] += n
        if n:
            log.info("task %d restored from %d changelog records in %.1fs: %d waiting impressions, watermark %d",
                     p, n, time.monotonic() - started, len(state.pending), state.watermark_us)
        return Task(state, featurizer, state.watermark_us)

    def _revoked(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        self.commit()
        self._forget(parts)

    def _lost(self, consumer: Consumer, parts: list[TopicPartition]) -> None:
        # another replica owns them now: what this one did since its last commit must not count
        if self._txn_open:
            self.producer.abort_transaction(60)
            self._txn_open = False
        raise StackError("the joiner lost its partitions (a too-long pause?); restart it: it resumes from its last commit")

    def _forget(self, parts: list[TopicPartition]) -> None:
        for tp in parts:
            self.tasks.pop(tp.partition, None)
            for d in (self.positions, self.stream_time, self._eof_at):
                d.pop((tp.topic, tp.partition), None)
            self.activity.forget((tp.topic, tp.partition))

    # --- reporting ----------------------------------------------------------------------------
    def _update_lag(self) -> None:
        self._last_lag = time.monotonic()
        lag = 0
        for (topic, p), pos in list(self.positions.items()):
            try:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=1, cached=False)
            except KafkaException:
                continue
            lag += max(0, high - pos)
        self.metrics.lag = lag
        self.metrics.state_entries = sum(t.state.size for t in self.tasks.values())

    def _report(self, now: float) -> None:
        done = self.metrics.counts["samples"]
        rate = (done - self._reported) / max(now - self._last_report, 1e-9) if self._last_report else 0.0
        self._last_report, self._reported = now, done
        log.info("joiner: %d samples (%.0f/s), %d dead letters, lag %d records, %d in state, tasks %s",
                 done, rate, self.metrics.counts["dead_letters"], self.metrics.lag, self.metrics.state_entries,
                 sorted(self.tasks))
