"""The exactly-once audit of a training run: did the trainer train every sample of its window
and of its Kafka range exactly once (per epoch), and how well was the batch phase shuffled?

Expected ids: the Iceberg window's training days [window_start, train_end) at the run's pinned
snapshot (the validation days [train_end, t_handoff) are never trained in the batch phase), and the
Kafka records in [handoff_offsets, final_offsets) with event_time >= t_handoff, both minus the
evaluation holdout (`slipstream.samples.schema.is_holdout`), which is never trained on. Trained ids: the
trainer's `audit/rank-*.parquet` (rows only for checkpointed progress).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from slipstream.samples.spec import Spec
    from slipstream.stream.kafka import Broker

from slipstream.samples.schema import is_holdout

log = logging.getLogger(__name__)
EXAMPLES = 10


@dataclass
class SourceAudit:
    source: str
    epoch: int
    expected: int
    trained_rows: int
    lost: int
    duplicated: int
    """Surplus training rows of ids trained more than once in this epoch."""
    unexpected: int
    """Trained ids that are not in the expected set (e.g. a holdout id, an id from outside the window)."""
    lost_examples: list[str] = field(default_factory=list)
    duplicated_examples: list[str] = field(default_factory=list)
    unexpected_examples: list[str] = field(default_factory=list)

    partial: bool = False
    """The run stopped inside this (last, not first) epoch: ids not trained yet are not lost."""

    @property
    def exactly_once(self) -> bool:
        return (self.lost == 0 or self.partial) and self.duplicated == 0 and self.unexpected == 0


@dataclass
class AuditResult:
    sources: list[SourceAudit]
    per_source_rows: dict[str, int]
    shuffle_score: float | None
    """1 - |Spearman correlation| between training step and event time in the batch phase:
    1.0 = no trace of the storage order left, 0.0 = trained in time order."""
    notes: list[str] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        return bool(self.sources) and all(s.exactly_once for s in self.sources)


def read_audit(run_dir: Path) -> pa.Table | None:
    files = sorted((run_dir / "audit").glob("rank-*.parquet"))
    if not files:
        return None
    return pa.concat_tables(pq.read_table(f) for f in files)


def _trainable(ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    ids = pc.drop_null(ids)
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    return ids.filter(pa.array(~is_holdout(ids))) if len(ids) else ids


def compare_ids(source: str, epoch: int, expected: pa.Array, trained: pa.Array) -> SourceAudit:
    """Lost, duplicated and unexpected ids of one source and epoch, with a few examples each."""
    vc = pc.value_counts(trained) if len(trained) else None
    dup_ids: list[str] = []
    surplus = 0
    if vc is not None:
        counts = vc.field("counts")
        many = pc.greater(counts, 1)
        surplus = int(pc.sum(pc.subtract(pc.filter(counts, many), 1)).as_py() or 0)
        dup_ids = pc.filter(vc.field("values"), many).slice(0, EXAMPLES).to_pylist()
    lost = expected.filter(pc.invert(pc.is_in(expected, value_set=trained))) if len(expected) else expected
    extra = trained.filter(pc.invert(pc.is_in(trained, value_set=expected))) if len(trained) else trained
    extra = pc.unique(extra)
    return SourceAudit(
        source, epoch, len(expected), len(trained), len(lost), surplus, len(extra),
        lost.slice(0, EXAMPLES).to_pylist(), dup_ids, extra.slice(0, EXAMPLES).to_pylist(),
    )


def shuffle_score(audit: pa.Table, ids: pa.Array, event_time: pa.Array) -> float | None:
    """Score the batch phase's first epoch: 1 - |Spearman(step, event_time)|."""
    rows = audit.filter(pc.and_(pc.equal(audit.column("source"), "iceberg"), pc.equal(audit.column("epoch"), 0)))
    if rows.num_rows < 3:
        return None
    idx = pc.index_in(rows.column("sample_id"), value_set=ids)
    ok = pc.is_valid(idx)
    idx = pc.filter(idx, ok).to_numpy()
    steps = pc.filter(rows.column("step"), ok).to_numpy().astype(np.float64)
    if len(idx) < 3:
        return None
    ts = pc.cast(event_time, pa.int64()).to_numpy()[idx].astype(np.float64)
    # ties in step (a batch shares a step) are fine: ranks of a stable argsort differ by < batch size
    rs = np.argsort(np.argsort(steps, kind="stable"), kind="stable").astype(np.float64)
    rt = np.argsort(np.argsort(ts, kind="stable"), kind="stable").astype(np.float64)
    rho = np.corrcoef(rs, rt)[0, 1]
    return float(1.0 - abs(rho)) if np.isfinite(rho) else None


def read_kafka_range(
    bootstrap: Broker, topic: str, start: dict[int, int], end: dict[int, int], timeout_s: float = 30.0,
    spec: "Spec | None" = None,
) -> pa.Table:
    """Decode the records of [start, end) per partition (`spec`'s sample columns + partition/offset)."""
    from confluent_kafka import Consumer, TopicPartition

    from slipstream.samples.codec import decode_samples
    from slipstream.stream.kafka import consumer_config

    c = Consumer(consumer_config(bootstrap, group="slipstream-audit"))
    parts: list[pa.Table] = []
    try:
        todo = {p: (o, end[p]) for p, o in start.items() if p in end and end[p] > o}
        c.assign([TopicPartition(topic, p, o) for p, (o, _) in todo.items()])
        remaining = {p: e for p, (_, e) in todo.items()}
        import time

        deadline = time.monotonic() + timeout_s
        while remaining and time.monotonic() < deadline:
            msgs = c.consume(10_000, timeout=1.0)
            values, meta = [], []
            for m in msgs:
                if m.error():
                    continue
                p, off = m.partition(), m.offset()
                if p in remaining and off < remaining[p]:
                    values.append(m.value())
                    meta.append((p, off))
            # Positions, not the last offset seen: transaction markers occupy offsets too.
            for tp in c.position([TopicPartition(topic, p) for p in list(remaining)]):
                if tp.offset >= remaining[tp.partition]:
                    remaining.pop(tp.partition)
                    c.pause([TopicPartition(topic, tp.partition)])
            if values:
                dec = decode_samples(values, spec)
                m_arr = np.asarray(meta, dtype=np.int64)[dec.good_index]
                t = dec.table.append_column("partition", pa.array(m_arr[:, 0], pa.int32()))
                parts.append(t.append_column("offset", pa.array(m_arr[:, 1], pa.int64())))
        if remaining:
            raise TimeoutError(f"Kafka range of {topic} not fully read in {timeout_s:.0f}s: partitions {sorted(remaining)} short")
    finally:
        c.close()
    return pa.concat_tables(parts) if parts else pa.table({"sample_id": pa.array([], pa.string())})


def _record_keys(t: pa.Table) -> pa.Array:
    """partition * 2^40 + offset: one int64 per Kafka record."""
    t = t.select(["partition", "offset"]).combine_chunks()
    part, off = (pc.cast(t.column(c).chunk(0) if t.column(c).num_chunks else pa.array([], pa.int64()), pa.int64())
                 for c in ("partition", "offset"))
    return pc.add(pc.multiply(part, 1 << 40), off)


def _before_forward_tail(after: pa.Table, metrics: dict[str, Any], notes: list[str]) -> pa.Table:
    """The stream records before the run's forward tail: the tail (event time >= its start) is
    scored at the end, never trained, so it is not expected in training."""
    start = metrics.get("forward_tail_start")
    if not start or not after.num_rows:
        return after
    ts = after.column("event_time")
    before = pc.less(ts, pa.scalar(datetime.fromisoformat(start), ts.type))
    held = after.num_rows - (pc.sum(before).as_py() or 0)
    notes.append(f"{held:,} records of the forward tail (event time from {start} on) are scored, never trained: not expected")
    return after.filter(before)


def audit_run(
    audit: pa.Table, window_ids: pa.Array, window_times: pa.Array, metrics: dict[str, Any],
    kafka: pa.Table | None,
) -> AuditResult:
    """Compare the trained ids with the expected ones, per source and epoch."""
    notes: list[str] = []
    if metrics.get("train_end") and metrics["train_end"] != metrics.get("t_handoff"):
        # the validation days before T are scored, never trained, in the batch phase
        end = datetime.fromisoformat(metrics["train_end"])
        before = pc.less(window_times, pa.scalar(end, window_times.type))
        held = pc.sum(pc.invert(before)).as_py() or 0
        window_ids, window_times = pc.filter(window_ids, before), pc.filter(window_times, before)
        notes.append(f"{held:,} rows of the validation days from {metrics['train_end']} to T are scored, not trained, "
                     "in the batch phase: not expected")
    expected_batch = _trainable(window_ids)
    sources: list[SourceAudit] = []
    src = audit.column("source")
    per_source = {s: int(n) for s, n in zip(*[c.to_pylist() for c in pc.value_counts(src).flatten()])}
    epochs = sorted(set(pc.filter(audit.column("epoch"), pc.equal(src, "iceberg")).to_pylist()))
    for epoch in epochs:
        rows = audit.filter(pc.and_(pc.equal(src, "iceberg"), pc.equal(audit.column("epoch"), epoch)))
        a = compare_ids("iceberg", int(epoch), expected_batch, rows.column("sample_id").combine_chunks())
        # The audit holds checkpointed progress only: a run stopped during a later epoch (and
        # before any stream phase) has simply not reached the rest of it yet.
        if epoch == epochs[-1] and epoch > epochs[0] and kafka is None and not pc.any(pc.equal(src, "kafka")).as_py():
            a.partial = a.lost > 0
            if a.partial:
                notes.append(f"epoch {epoch} is partial ({a.trained_rows:,} of {a.expected:,} trained when the run stopped)")
        sources.append(a)
    if not sources:
        sources.append(compare_ids("iceberg", 0, expected_batch, pa.array([], pa.string())))
    if kafka is not None:
        t_handoff = datetime.fromisoformat(metrics["t_handoff"])
        after = kafka.filter(pc.greater_equal(kafka.column("event_time"), pa.scalar(t_handoff, kafka.column("event_time").type)))
        dead = audit.filter(pc.equal(src, "dead_letter"))
        if dead.num_rows and after.num_rows:
            # the trainer refused these (e.g. an event time far in the future): rejected, not lost
            refused = pc.is_in(_record_keys(after), value_set=_record_keys(dead))
            notes.append(f"{dead.num_rows:,} records went to the dead-letter topic ({pc.sum(refused).as_py():,} of them "
                         "decodable with event_time >= t_handoff): not expected in training")
            after = after.filter(pc.invert(refused))
        after = _before_forward_tail(after, metrics, notes)
        expected_stream = _trainable(after.column("sample_id"))
        rows = audit.filter(pc.equal(src, "kafka"))
        sources.append(compare_ids("kafka", 0, expected_stream, rows.column("sample_id").combine_chunks()))
        dropped = kafka.num_rows - after.num_rows
        notes.append(f"Kafka range held {kafka.num_rows:,} records; {dropped:,} had event_time < t_handoff (already in the batch) and are not expected")
    score = shuffle_score(audit, window_ids.combine_chunks() if isinstance(window_ids, pa.ChunkedArray) else window_ids,
                          window_times.combine_chunks() if isinstance(window_times, pa.ChunkedArray) else window_times)
    return AuditResult(sources, per_source, score, notes)
