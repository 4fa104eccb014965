"""The exactly-once audit of a training run: did the trainer train every sample of its window
and of its Kafka range exactly once (per epoch), and how well was the batch phase shuffled?

Expected ids: the Iceberg window's training days [window_start, train_end) at the run's pinned
snapshot (the validation days [train_end, t_handoff) are never trained in the batch phase), and the
Kafka records *committed* in [handoff_offsets, stop_offsets) with event_time >= t_handoff, both
minus the evaluation holdout (`slipstream.samples.schema.is_holdout`), which is never trained on.
Trained ids: the trainer's `audit/rank-*.parquet` (rows only for checkpointed progress).

The Kafka side is counted by a fresh consumer of the audit's own (`slipstream.stream.committed_count`),
started before the range and reading through aborted transactions, never from the trainer's
positions. `stop_offsets` is the committed end of each partition when the stream phase stopped
(metrics.json; runs that did not record it are audited up to their final positions, with a note).
A committed record below the run's final position that was not trained, held out, dead-lettered,
refused as a duplicate sample id (audit source `duplicate`) or dropped before T is *lost*, named
by partition and offsets. One at or after the final position is *unread*: the stream phase's lag
at its stop, counted from committed records; a run that stopped as caught up (lag 0) with unread
records lost them too.

The stream before T: the stream phase skips every record with event_time < t_handoff as "already in
the batch". That holds only if the table has it, so the Kafka range read for the audit starts at
the window's start (`stream_audit_start`), and each record of [window_start, t_handoff) whose id the
window at the pinned snapshot lacks is counted as lost (source `kafka before T`): it was in neither
the table nor the trained stream.
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
RANGE_GAP = 20
"""Lost records this many offsets apart or closer are named as one range (markers, held-out and
dead-lettered records lie between them)."""


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
    lost_where: list[str] = field(default_factory=list)
    """Where the lost records lie (Kafka: "partition P offsets A..B (N)")."""
    unread: int = 0
    """Kafka: committed records after the run's final position, not trained (the lag at its stop)."""
    unread_where: list[str] = field(default_factory=list)

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
    committed_lag: dict[int, int] | None = None
    """Per partition, committed records between the run's final position and the committed end
    at its stop (None: no stream phase audited)."""

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
    bootstrap: Broker, topic: str, start: dict[int, int], end: dict[int, int], timeout_s: float = 120.0,
    spec: Spec | None = None,
) -> pa.Table:
    """The committed records of [start, end) per partition, decoded (`spec`'s sample columns +
    partition/offset), read by a fresh consumer from before the range (`count_committed`).
    Records that are not samples of the spec are left out (the trainer dead-letters them).
    Raises StreamReadError when a partition cannot be read to its end."""
    from slipstream.stream.committed_count import count_committed

    ranges = {p: (o, end[p]) for p, o in start.items() if p in end and end[p] > o}
    counted = count_committed(bootstrap, topic, ranges, spec=spec, decode=True, timeout_s=timeout_s)
    if counted.samples is None:
        return pa.table({"sample_id": pa.array([], pa.string())})
    return counted.samples


def offset_ranges(partitions: np.ndarray, offsets: np.ndarray, limit: int = EXAMPLES) -> list[str]:
    """Records as runs of offsets per partition: "partition 2 offsets 3896..23219 (12,580)"; a
    run continues across offsets that hold no record of the set (markers, other records)."""
    out: list[str] = []
    for p in np.unique(partitions).tolist():
        o = np.sort(offsets[partitions == p])
        breaks = np.flatnonzero(np.diff(o) > RANGE_GAP) + 1
        for run in np.split(o, breaks):
            out.append(f"partition {p} offsets {run[0]}..{run[-1]} ({len(run):,})" if len(run) > 1
                       else f"partition {p} offset {run[0]}")
    return out[:limit] + ([f"... {len(out) - limit} more ranges"] if len(out) > limit else [])


def _record_keys(t: pa.Table) -> pa.Array:
    """partition * 2^40 + offset: one int64 per Kafka record."""
    t = t.select(["partition", "offset"]).combine_chunks()
    part, off = (pc.cast(t.column(c).chunk(0) if t.column(c).num_chunks else pa.array([], pa.int64()), pa.int64())
                 for c in ("partition", "offset"))
    return pc.add(pc.multiply(part, 1 << 40), off)


def stream_audit_start(bootstrap: Broker, topic: str, window_start: datetime, handoff: dict[int, int],
                       timeout_s: float = 30.0) -> dict[int, int]:
    """Per partition, where the audit reads the stream from: the first record at or after the
    window's start (never after the handoff offset), so the records the stream phase skipped as
    "before T" can be checked against the table."""
    from confluent_kafka import Consumer, TopicPartition

    from slipstream.stream.kafka import consumer_config

    c = Consumer(consumer_config(bootstrap, group="slipstream-audit"))
    try:
        ms = int(window_start.timestamp() * 1000)
        found = c.offsets_for_times([TopicPartition(topic, p, ms) for p in handoff], timeout=timeout_s)
    finally:
        c.close()
    out = dict(handoff)
    for tp in found:
        if tp.offset >= 0 and tp.partition in out:  # -1: no record at or after it (the end)
            out[tp.partition] = min(out[tp.partition], tp.offset)
    return out


def _stream_before_t(kafka: pa.Table, all_ids: pa.Array, all_times: pa.Array, metrics: dict[str, Any],
                     t_handoff: datetime) -> tuple[SourceAudit | None, str]:
    """The stream's records before T that the window lacks: in neither the table nor the trained
    stream, so lost. Records before the window's start are outside the run."""
    if "event_time" not in kafka.column_names:
        return None, "Kafka range held no decodable record"
    t = kafka.column("event_time")
    before = kafka.filter(pc.less(t, pa.scalar(t_handoff, t.type)))
    if not before.num_rows:
        return None, "Kafka range held no record with event_time < t_handoff"
    if metrics.get("window_start"):
        start = datetime.fromisoformat(metrics["window_start"])
    else:
        start = pc.min(all_times).as_py() if len(all_times) else t_handoff
    bt = before.column("event_time")
    in_window = before.filter(pc.greater_equal(bt, pa.scalar(start, bt.type)))
    ids = in_window.column("sample_id").combine_chunks()
    missing = ids.filter(pc.invert(pc.is_in(ids, value_set=all_ids))) if len(ids) else ids
    older = before.num_rows - in_window.num_rows
    note = (f"Kafka held {before.num_rows:,} records with event_time < t_handoff: {len(ids) - len(missing):,} in the "
            f"window at the pinned snapshot (trained or scored in the batch phase), {len(missing):,} not in it (lost: in "
            f"neither the table nor the trained stream)" + (f", {older:,} before the window (outside the run)" if older else ""))
    audit = SourceAudit("kafka before T", 0, len(ids), len(ids) - len(missing), len(missing), 0, 0,
                        missing.slice(0, EXAMPLES).to_pylist())
    return audit, note


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
    """Compare the trained ids with the expected ones, per source and epoch. `kafka` holds the
    records read from `stream_audit_start` (or the handoff offsets) to the final offsets."""
    notes: list[str] = []
    all_ids, all_times = window_ids, window_times
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
    lag: dict[int, int] | None = None
    if kafka is not None:
        stream, stream_notes, lag = audit_stream(audit, kafka, metrics)
        sources.append(stream)
        notes += stream_notes
        known = pc.drop_null(all_ids)
        known = known.combine_chunks() if isinstance(known, pa.ChunkedArray) else known
        before_t, note = _stream_before_t(kafka, known, all_times, metrics, datetime.fromisoformat(metrics["t_handoff"]))
        if before_t is not None:
            sources.append(before_t)
        notes.append(note)
    score = shuffle_score(audit, window_ids.combine_chunks() if isinstance(window_ids, pa.ChunkedArray) else window_ids,
                          window_times.combine_chunks() if isinstance(window_times, pa.ChunkedArray) else window_times)
    return AuditResult(sources, per_source, score, notes, lag)


def audit_stream(audit: pa.Table, kafka: pa.Table, metrics: dict[str, Any]) -> tuple[SourceAudit, list[str], dict[int, int]]:
    """The stream phase against the committed records of its range (`kafka`: decoded, with
    partition/offset): lost (named by partition and offsets), duplicated, unexpected, unread."""
    notes: list[str] = []
    src = audit.column("source")
    t_handoff = datetime.fromisoformat(metrics["t_handoff"])
    reached = {int(p): int(o) for p, o in (metrics.get("final_offsets") or {}).items()}
    after = kafka.filter(pc.greater_equal(kafka.column("event_time"), pa.scalar(t_handoff, kafka.column("event_time").type)))
    before_t = kafka.num_rows - after.num_rows
    dead = audit.filter(pc.equal(src, "dead_letter"))
    if dead.num_rows and after.num_rows:
        # the trainer refused these (e.g. an event time far in the future): rejected, not lost
        refused = pc.is_in(_record_keys(after), value_set=_record_keys(dead))
        notes.append(f"{dead.num_rows:,} records went to the dead-letter topic ({pc.sum(refused).as_py():,} of them "
                     "decodable with event_time >= t_handoff): not expected in training")
        after = after.filter(pc.invert(refused))
    dupes = audit.filter(pc.equal(src, "duplicate"))
    if dupes.num_rows and after.num_rows:
        # a later record of a sample id the trainer had admitted: its id is expected once, from the first
        again = pc.is_in(_record_keys(after), value_set=_record_keys(dupes))
        notes.append(f"{dupes.num_rows:,} records repeated a sample id already admitted (dedupe): dead-lettered as "
                     "duplicates, the id trained once")
        after = after.filter(pc.invert(again))
    after = _before_forward_tail(after, metrics, notes)
    after = after.filter(pa.array(~is_holdout(after.column("sample_id")))) if after.num_rows else after
    after = after.filter(pc.is_valid(after.column("sample_id")))
    rows = audit.filter(pc.equal(src, "kafka"))
    trained = rows.column("sample_id").combine_chunks()
    result = compare_ids("kafka", 0, after.column("sample_id").combine_chunks(), trained)
    parts = np.asarray(kafka.column("partition").to_numpy(zero_copy_only=False), dtype=np.int64)
    offs = np.asarray(kafka.column("offset").to_numpy(zero_copy_only=False), dtype=np.int64)
    lag = {p: int(((parts == p) & (offs >= o)).sum()) for p, o in sorted(reached.items())}
    if after.num_rows and result.lost:
        missing = after.filter(pc.invert(pc.is_in(after.column("sample_id"), value_set=trained)))
        mp = np.asarray(missing.column("partition").to_numpy(zero_copy_only=False), dtype=np.int64)
        mo = np.asarray(missing.column("offset").to_numpy(zero_copy_only=False), dtype=np.int64)
        ends = np.asarray([reached.get(int(p), 1 << 62) for p in mp], dtype=np.int64)
        unread = mo >= ends
        caught_up = metrics.get("kafka_lag_at_stop") == 0
        if unread.any() and not caught_up:
            result.unread, result.unread_where = int(unread.sum()), offset_ranges(mp[unread], mo[unread])
            result.lost -= result.unread
            result.lost_examples = pc.filter(missing.column("sample_id"), pa.array(~unread)).to_pylist()[:EXAMPLES]
            mp, mo = mp[~unread], mo[~unread]
        elif unread.any():
            notes.append(f"the run stopped as caught up (lag 0), yet {int(unread.sum()):,} committed records it should "
                         "have trained lay beyond its final position: lost")
        result.lost_where = offset_ranges(mp, mo)
    if "stop_offsets" not in metrics:
        notes.append("metrics.json has no stop_offsets (the committed end when the stream phase stopped): audited up "
                     "to the run's final positions only")
    notes.append(f"Kafka range held {kafka.num_rows:,} committed records (counted by a fresh reader from before the "
                 f"range); {before_t:,} had event_time < t_handoff (already in the batch) and are not expected")
    return result, notes, lag
