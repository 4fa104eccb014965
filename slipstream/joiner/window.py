"""The join of one task (partition p of the impression and click topics), by event time, columnar.

Impressions wait as Arrow rows (`PendingRows`: chunks sorted by event time) until the watermark
passes their window's end (time + the spec's attribution window); they then leave in one table,
each labelled 1 if a click on its id happened within the window after it (the Spark job's rule,
`spark_jobs.transforms._clicked`). A click whose impression has not arrived yet waits as an
orphan until no impression it could label can still come. What cannot be joined is returned with
a reason (the caller sends it to the dead-letter topic): a duplicate impression id, an impression
whose window had already closed (late), a click after its impression's window closed (late
click), a click whose impression never came.

Pure bookkeeping, no Kafka. The changelog (`changes()` / `apply_rows()` + `apply()`) holds what
cannot be derived: the impressions taken (an Arrow table), the clicks and orphans that changed,
and the watermark. Everything the watermark does (closing windows, forgetting emitted ids,
expiring orphans) is a function of the state and the watermark, so a replay redoes it.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

from slipstream.samples.spec import SAMPLE_ID as ID_COLUMN

US_PER_S = 1_000_000
NO_TIME = -(1 << 62)
KEEP_DONE_WINDOWS = 3
"""An emitted id is remembered until the watermark passes its time + this many windows (two
windows after its own closed), to tell a late click or a re-sent impression from a stranger."""
MAX_ARROW_CHUNKS = 32
"""A merged chunk made of more Arrow chunks than this is copied into one (reads stay fast)."""
TS_COLUMN = "__ts_us"
"""The event time column of the changelog's row tables."""


@dataclass
class Closed:
    """Impressions whose window closed: their rows (as taken), times, labels."""

    rows: pa.Table
    ts_us: np.ndarray
    label: np.ndarray
    """int32, 1 when a click on the impression's id came within its window."""
    late_clicks: int
    """Clicks on them that came after their window (attached while they waited; they do not label)."""

    @property
    def ids(self) -> list[str]:
        ids: list[str] = self.rows.column(ID_COLUMN).to_pylist()
        return ids


@dataclass
class Rejected:
    reason: str
    raw: bytes


class PendingRows:
    """Waiting impressions as Arrow chunks, each sorted by event time; closing a window cuts a
    prefix of each chunk. Neighbouring chunks of similar size are merged (as in a log-structured
    merge), so there are O(log n) chunks; in-order input merges without copying."""

    def __init__(self) -> None:
        self.chunks: list[tuple[pa.Table, np.ndarray]] = []

    def add(self, rows: pa.Table, ts: np.ndarray) -> None:
        if not len(ts):
            return
        self.chunks.append(_sorted(rows, ts))
        while len(self.chunks) >= 2 and len(self.chunks[-2][1]) <= 2 * len(self.chunks[-1][1]):
            (a, ta), (b, tb) = self.chunks.pop(), self.chunks.pop()
            merged = pa.concat_tables([b, a])
            if merged.num_columns and merged.column(0).num_chunks > MAX_ARROW_CHUNKS:
                merged = merged.combine_chunks()
            self.chunks.append(_sorted(merged, np.concatenate([tb, ta])))

    def take_until(self, ts_max: int) -> tuple[pa.Table, np.ndarray] | None:
        """Remove and return the rows with time <= ts_max (None when there are none)."""
        out, keep = [], []
        for rows, ts in self.chunks:
            n = int(np.searchsorted(ts, ts_max, side="right"))
            if n:
                out.append((rows.slice(0, n), ts[:n]))
            if n < len(ts):
                keep.append((rows.slice(n), ts[n:]))
        self.chunks = keep
        if not out:
            return None
        return pa.concat_tables([r for r, _ in out]), np.concatenate([t for _, t in out])

    def __len__(self) -> int:
        return sum(len(ts) for _, ts in self.chunks)


def _sorted(rows: pa.Table, ts: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    if len(ts) < 2 or bool((ts[1:] >= ts[:-1]).all()):
        return rows, ts
    order = np.argsort(ts, kind="stable")
    return rows.take(pa.array(order)), ts[order]


@dataclass
class TaskState:
    window_us: int
    watermark_us: int = NO_TIME
    pending: PendingRows = field(default_factory=PendingRows)
    waiting: dict[str, int] = field(default_factory=dict)
    """id -> time of each pending impression."""
    clicks: dict[str, list[int]] = field(default_factory=dict)
    """id -> click times (us) of a pending impression that has clicks."""
    orphans: dict[str, list[list[Any]]] = field(default_factory=dict)
    """id -> [[click us, raw record text], ...] for clicks that came before their impression."""
    done: dict[str, int] = field(default_factory=dict)
    """ids already emitted -> their time (kept a while, to name late clicks and duplicates)."""
    _done_order: deque[tuple[np.ndarray, list[str]]] = field(default_factory=deque)
    """(times, ids) of each closed batch, sorted by time: when `done` entries are forgotten."""
    _new_rows: list[pa.Table] = field(default_factory=list)
    _dirty: dict[str, set[str]] = field(default_factory=lambda: {"clicks": set(), "orphans": set()})
    _orphans_due: list[tuple[int, str]] = field(default_factory=list)
    """A heap of (time us, id): when an orphan may expire (skipped when it changed since)."""

    # --- input --------------------------------------------------------------------------------
    def impressions(self, ids: list[str], ts: np.ndarray, rows: pa.Table) -> list[tuple[int, str]]:
        """Take a batch of impressions (`rows` carries `sample_id` = `ids`); returns (index,
        reason) of the rejected ones. Within the batch, as across batches, the first of an id wins."""
        rejected: list[tuple[int, str]] = []
        if not ids:
            return rejected
        waiting, done = self.waiting, self.done
        late = (ts + self.window_us <= self.watermark_us).tolist()
        keep = np.zeros(len(ids), dtype=bool)
        for i, (sid, t) in enumerate(zip(ids, ts.tolist())):
            if sid in waiting or sid in done:
                rejected.append((i, f"duplicate impression id {sid}: the first one is kept"))
            elif late[i]:
                rejected.append((i, f"late impression: its window closed at {_iso(t + self.window_us)}, the joiner's "
                                    f"watermark is already {_iso(self.watermark_us)} (raise --lateness-s to wait longer)"))
            else:
                waiting[sid] = t
                keep[i] = True
        if self.orphans:
            for sid in self.orphans.keys() & set(ids):
                if sid in waiting:
                    self.clicks.setdefault(sid, []).extend(int(c[0]) for c in self.orphans.pop(sid))
                    self._dirty["orphans"].add(sid)
                    self._dirty["clicks"].add(sid)
        if rejected:
            rows, ts = rows.filter(pa.array(keep)), ts[keep]
        self.pending.add(rows, ts)
        self._new_rows.append(rows.append_column(TS_COLUMN, pa.array(ts, pa.int64())))
        return rejected

    def click(self, sample_id: str, ts_us: int, raw: bytes) -> str | None:
        """Take a click on impression `sample_id`; returns the reason when it is rejected."""
        if sample_id in self.waiting:
            self.clicks.setdefault(sample_id, []).append(ts_us)
            self._dirty["clicks"].add(sample_id)
            return None
        if sample_id in self.done:
            return (f"late click: impression {sample_id}'s window closed at "
                    f"{_iso(self.done[sample_id] + self.window_us)} before the click arrived")
        if ts_us + self.window_us <= self.watermark_us:
            return f"click without impression: no impression {sample_id} arrived in time"
        self.orphans.setdefault(sample_id, []).append([ts_us, raw.decode("utf-8", "replace")])
        self._dirty["orphans"].add(sample_id)
        heapq.heappush(self._orphans_due, (ts_us + self.window_us, sample_id))
        return None

    # --- time ---------------------------------------------------------------------------------
    def advance(self, watermark_us: int) -> tuple[Closed | None, list[Rejected]]:
        """Move the watermark (it never goes back) and close what it passes: the impressions whose
        window ended (in no particular order), the orphan clicks that can no longer find their
        impression (rejected), and the memory of emitted ids `KEEP_DONE_WINDOWS` windows later."""
        if watermark_us <= self.watermark_us:
            return None, []
        self.watermark_us = watermark_us
        closed = self._close(watermark_us - self.window_us)
        rejected: list[Rejected] = []
        due = self._orphans_due
        while due and due[0][0] <= watermark_us:
            at, sid = heapq.heappop(due)
            if sid in self.orphans and max(c[0] for c in self.orphans[sid]) + self.window_us <= at:
                for _, raw in self.orphans.pop(sid):
                    rejected.append(Rejected(f"click without impression: no impression {sid} arrived within "
                                             "the attribution window", raw.encode()))
                self._dirty["orphans"].add(sid)
        self._forget_done(watermark_us - KEEP_DONE_WINDOWS * self.window_us)
        return closed, rejected

    def _close(self, ts_max: int) -> Closed | None:
        taken = self.pending.take_until(ts_max)
        if taken is None:
            return None
        rows, ts = taken
        ids: list[str] = rows.column(ID_COLUMN).to_pylist()
        label = np.zeros(len(ids), dtype=np.int32)
        late_clicks = 0
        waiting, clicks = self.waiting, self.clicks
        for sid in ids:
            del waiting[sid]
        if clicks:
            for i, (sid, t0) in enumerate(zip(ids, ts.tolist())):
                times = clicks.pop(sid, None)
                if times is not None:
                    self._dirty["clicks"].add(sid)
                    label[i] = any(t0 <= c <= t0 + self.window_us for c in times)
                    late_clicks += sum(c > t0 + self.window_us for c in times)
        self.done.update(zip(ids, ts.tolist()))
        order = np.argsort(ts, kind="stable")
        self._done_order.append((ts[order], [ids[i] for i in order.tolist()]))
        return Closed(rows, ts, label, late_clicks)

    def _forget_done(self, before_or_at: int) -> None:
        order = self._done_order
        while order and order[0][0][0] <= before_or_at:
            ts, ids = order[0]
            n = int(np.searchsorted(ts, before_or_at, side="right"))
            for sid, t in zip(ids[:n], ts[:n].tolist()):
                if self.done.get(sid) == t:  # not an id emitted again since
                    del self.done[sid]
            if n == len(ids):
                order.popleft()
            else:
                order[0] = (ts[n:], ids[n:])

    # --- changelog ----------------------------------------------------------------------------
    def changes(self) -> tuple[pa.Table | None, dict[str, Any]]:
        """What changed since the last call: the impressions taken (rows with their time in
        `TS_COLUMN`), and as JSON-able data the watermark and the clicks and orphans that changed
        (None = removed)."""
        rows = pa.concat_tables(self._new_rows) if self._new_rows else None
        self._new_rows = []
        out: dict[str, Any] = {"watermark": self.watermark_us}
        for name in ("clicks", "orphans"):
            table = getattr(self, name)
            out[name] = {k: table.get(k) for k in self._dirty[name]}
            self._dirty[name].clear()
        return rows, out

    def apply_rows(self, rows: pa.Table) -> None:
        """Replay impressions taken (a `changes()` row table), before the record of their commit."""
        ts = rows.column(TS_COLUMN).to_numpy()
        rows = rows.drop_columns([TS_COLUMN])
        self.waiting.update(zip(rows.column(ID_COLUMN).to_pylist(), ts.tolist()))
        self.pending.add(rows, ts)

    def apply(self, delta: dict[str, Any]) -> None:
        """Replay a `changes()` record (restore after a restart or a rebalance): the clicks and
        orphans as they were, then the watermark, which closes and forgets what it did live."""
        for name in ("clicks", "orphans"):
            table = getattr(self, name)
            for k, v in delta.get(name, {}).items():
                if v is None:
                    table.pop(k, None)
                else:
                    table[k] = v
        for sid, cs in delta.get("orphans", {}).items():
            if cs:
                heapq.heappush(self._orphans_due, (max(c[0] for c in cs) + self.window_us, sid))
        self.advance(int(delta.get("watermark", NO_TIME)))
        self._new_rows = []
        for dirty in self._dirty.values():
            dirty.clear()

    @property
    def size(self) -> int:
        return len(self.waiting) + len(self.orphans) + len(self.done)


def _iso(us: int) -> str:
    if us <= NO_TIME:
        return "(none yet)"
    return datetime.fromtimestamp(us / US_PER_S, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
