"""The rows of each evaluation set, rebuilt from data (never from memory), so a set is the same
whether the run went straight through or was killed and resumed.

- `validation_rows`: the validation days [train_end, T) of the planned window (rank r reads units
  r, r + world, ...): never trained, the batch phase's early stopping scores them.
- `holdout_before_t`: the hash hold-out (`slipstream.samples.schema.is_holdout`) of the window.
- `forward_tail_rows`: the stream records with event time at or after the forward tail's start,
  from the offset where the tail begins (found like the handoff: `slipstream.stream.handoff`) to
  the run's final offsets. Never trained: the future of the final model.
- `holdout_after_t`: the hash hold-out of the stream before the tail, the last records before it:
  interleaved with rows the model trained on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slipstream.samples.codec import decode_samples
from slipstream.samples.schema import HOLDOUT_MODULO
from slipstream.samples.spec import EVENT_TIME, Spec
from slipstream.stream.handoff import find_handoff
from trainers.data.holdout import holdout_mask
from trainers.data.iceberg_source import ChunkStats, read_units, select_rows
from trainers.data.kafka_source import assigned_partitions, read_range
from trainers.data.rows import SOURCE_ICEBERG, SOURCE_KAFKA, RowLayout, Rows
from trainers.data.units import Opener, WorkUnit

log = logging.getLogger(__name__)


def _overlaps(md: pq.FileMetaData, group: int, column: int, start_us: int, end_us: int) -> bool:
    """Whether a row group may hold event times in [start_us, end_us) (no statistics: maybe)."""
    stats = md.row_group(group).column(column).statistics
    if stats is None or not stats.has_min_max:
        return True
    lo, hi = stats.min, stats.max
    lo_us = int(lo.timestamp() * 1_000_000) if hasattr(lo, "timestamp") else int(lo)
    hi_us = int(hi.timestamp() * 1_000_000) if hasattr(hi, "timestamp") else int(hi)
    return hi_us >= start_us and lo_us < end_us


def validation_rows(units: list[WorkUnit], open_file: Opener, layout: RowLayout, start_us: int, end_us: int,
                    rank: int, world: int, cap: int) -> Rows:
    """This rank's share (units r, r + world, ...) of the rows with start_us <= event time < end_us,
    at most `cap`. Row groups whose event-time statistics lie outside are not read."""
    out: list[Rows] = []
    n = 0
    for unit in units[rank::world]:
        with open_file(unit.path) as fh:
            pf = pq.ParquetFile(fh)
            names = pf.schema_arrow.names
            if EVENT_TIME not in names:
                continue
            if not _overlaps(pf.metadata, unit.row_group, names.index(EVENT_TIME), start_us, end_us):
                continue
            table = pf.read_row_group(unit.row_group, columns=[c for c in layout.read_columns if c in names])
        us = pc.cast(table.column(EVENT_TIME), pa.int64())
        table = table.filter(pc.and_(pc.greater_equal(us, start_us), pc.less(us, end_us)))
        if table.num_rows:
            out.append(Rows.from_arrow(table, layout, source=SOURCE_ICEBERG))
            n += table.num_rows
        if n >= cap:
            break
    return Rows.first(out, layout, cap)


def holdout_before_t(units: list[WorkUnit], open_file: Opener, layout: RowLayout, window: tuple[datetime, datetime],
                     rank: int, world: int, cap: int) -> Rows:
    """This rank's share of the window's hash hold-out, at most `cap` rows."""
    mine = units[rank::world]
    start_us, t_us = (_us(t) for t in window)
    out: list[Rows] = []
    n = 0
    for s in range(0, len(mine), 32):
        table = read_units(mine[s : s + 32], open_file, layout=layout)
        _, hold = select_rows(table, start_us, t_us, ChunkStats())
        out.append(Rows.from_arrow(hold, layout, source=SOURCE_ICEBERG))
        n += hold.num_rows
        if n >= cap:
            break
    return Rows.first(out, layout, cap)


def _us(t: datetime) -> int:
    return int(t.timestamp() * 1_000_000)


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, tz=UTC).isoformat()


class StreamSets:
    """The after-T evaluation sets of a run's stream, read by offset range from Kafka.

    `start` and `final` are every partition's handoff and final offsets; rank r reads the
    partitions dealt to it. `tail_start_us` is None when the run has no forward tail."""

    def __init__(self, broker: object, topic: str, spec: Spec, group: str, start: dict[int, int], final: dict[int, int],
                 t_us: int, tail_start_us: int | None, max_lateness_s: float, rank: int, world: int) -> None:
        self.broker, self.topic, self.spec, self.group = broker, topic, spec, group
        self.layout = RowLayout.from_spec(spec)
        self.start, self.final = start, final
        self.t_us, self.tail_start_us = t_us, tail_start_us
        self.parts = assigned_partitions(sorted(start), rank, world) if start else []
        self._tail_offsets = self._find_tail(max_lateness_s, rank) if tail_start_us is not None and start else None

    def _find_tail(self, max_lateness_s: float, rank: int) -> dict[int, int]:
        """Per partition, an offset no tail record precedes (the handoff's rule at the tail's start)."""
        assert self.tail_start_us is not None
        when = datetime.fromtimestamp(self.tail_start_us / 1e6, tz=UTC)
        try:
            found = find_handoff(self.broker, self.topic, when, max_lateness_s).offsets  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001  (read the tail from the handoff instead: slower, same rows)
            if rank == 0:
                log.warning("the forward tail's first offsets could not be found (%s): reading it from the handoff", e)
            return dict(self.start)
        return {p: min(max(found.get(p, self.start[p]), self.start[p]), self.final.get(p, 0)) for p in self.start}

    def _read(self, ranges: dict[int, tuple[int, int]], keep: Callable[[Rows], np.ndarray], cap: int) -> Rows:
        out: list[Rows] = []
        n = 0
        for values, _, _ in read_range(self.broker, self.topic, ranges, self.group):  # type: ignore[arg-type]
            t = decode_samples(values, self.spec).table
            if t.num_rows == 0:
                continue
            rows = Rows.from_arrow(t, self.layout, source=SOURCE_KAFKA)
            rows = rows.mask(keep(rows))
            out.append(rows)
            n += len(rows)
            if n >= cap:
                break
        return Rows.first(out, self.layout, cap)

    def forward_tail(self, cap: int) -> Rows:
        """This rank's forward-tail rows (every record of the tail: hash hold-out or not), the
        earliest first, at most `cap`."""
        if self._tail_offsets is None:
            return Rows.empty(self.layout)
        tail = self.tail_start_us
        assert tail is not None
        ranges = {p: (self._tail_offsets[p], self.final.get(p, 0)) for p in self.parts}
        return self._read(ranges, lambda r: r.event_us >= tail, cap)

    def holdout_after_t(self, cap: int) -> Rows:
        """This rank's hash hold-out after T and before the tail: the last records before it."""
        if not self.start:
            return Rows.empty(self.layout)
        ends = self._tail_offsets if self._tail_offsets is not None else self.final
        per_part = max(1, cap * HOLDOUT_MODULO // max(len(self.start), 1))
        ranges = {p: (max(self.start[p], ends.get(p, 0) - per_part), ends.get(p, 0)) for p in self.parts}
        tail = self.tail_start_us if self.tail_start_us is not None else np.iinfo(np.int64).max
        t_us = self.t_us
        return self._read(ranges, lambda r: (r.event_us >= t_us) & (r.event_us < tail) & holdout_mask(r.sample_id), cap)

    def describe(self) -> str:
        return "no forward tail" if self.tail_start_us is None else f"forward tail from {_iso(self.tail_start_us)}"
