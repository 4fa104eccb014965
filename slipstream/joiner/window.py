"""The join of one task (partition p of the impression and click topics), by event time.

An impression waits in `pending` until the watermark passes its window's end (time + the spec's
attribution window); it then leaves labelled 1 if a click on its id happened within the window
after it (the Spark job's rule, `spark_jobs.transforms._clicked`). A click whose impression has
not arrived yet waits as an orphan until no impression it could label can still come. What cannot
be joined is returned with a reason (the caller sends it to the dead-letter topic):
a duplicate impression id, an impression whose window had already closed (late), a click after
its impression's window closed (late click), a click whose impression never came.

Pure bookkeeping, no Kafka: `changes()` gives what changed since the last call, in the JSON form
the changelog stores, and `apply()` replays it after a restart.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

US_PER_S = 1_000_000
NO_TIME = -(1 << 62)
KEEP_DONE_WINDOWS = 3
"""An emitted id is remembered until the watermark passes its time + this many windows (two
windows after its own closed), to tell a late click or a re-sent impression from a stranger."""


@dataclass
class Closed:
    """An impression whose window closed: its row (event time in microseconds) and label."""

    sample_id: str
    row: dict[str, Any]
    ts_us: int
    label: int
    late_clicks: int
    """Clicks on it that came after its window (attached while it waited; they do not label it)."""


@dataclass
class Rejected:
    reason: str
    raw: bytes


@dataclass
class TaskState:
    window_us: int
    watermark_us: int = NO_TIME
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    """id -> {"row": fields, "ts": us, "clicks": [us, ...]}"""
    orphans: dict[str, list[list[Any]]] = field(default_factory=dict)
    """id -> [[click us, raw record text], ...] for clicks that came before their impression."""
    done: dict[str, int] = field(default_factory=dict)
    """ids already emitted -> their time (kept a while, to name late clicks and duplicates)."""
    _dirty: dict[str, set[str]] = field(default_factory=lambda: {"pending": set(), "orphans": set(), "done": set()})
    _due: list[tuple[int, int, str]] = field(default_factory=list)
    """A heap of (time us, kind, id): when an entry may be due (0 pending closes, 1 an orphan
    expires, 2 an emitted id is forgotten); entries whose object changed are skipped when popped."""

    def _schedule(self, at_us: int, kind: int, sample_id: str) -> None:
        heapq.heappush(self._due, (at_us, kind, sample_id))

    # --- input --------------------------------------------------------------------------------
    def impression(self, sample_id: str, row: dict[str, Any], ts_us: int) -> str | None:
        """Take an impression; returns the reason when it is rejected."""
        if sample_id in self.pending or sample_id in self.done:
            return f"duplicate impression id {sample_id}: the first one is kept"
        if ts_us + self.window_us <= self.watermark_us:
            return (f"late impression: its window closed at {_iso(ts_us + self.window_us)}, the joiner's watermark "
                    f"is already {_iso(self.watermark_us)} (raise --lateness-s to wait longer)")
        clicks = [int(c[0]) for c in self.orphans.pop(sample_id, [])]
        if clicks:
            self._dirty["orphans"].add(sample_id)
        self.pending[sample_id] = {"row": row, "ts": ts_us, "clicks": clicks}
        self._dirty["pending"].add(sample_id)
        self._schedule(ts_us + self.window_us, 0, sample_id)
        return None

    def click(self, sample_id: str, ts_us: int, raw: bytes) -> str | None:
        """Take a click on impression `sample_id`; returns the reason when it is rejected."""
        if sample_id in self.pending:
            self.pending[sample_id]["clicks"].append(ts_us)
            self._dirty["pending"].add(sample_id)
            return None
        if sample_id in self.done:
            return (f"late click: impression {sample_id}'s window closed at "
                    f"{_iso(self.done[sample_id] + self.window_us)} before the click arrived")
        if ts_us + self.window_us <= self.watermark_us:
            return f"click without impression: no impression {sample_id} arrived in time"
        self.orphans.setdefault(sample_id, []).append([ts_us, raw.decode("utf-8", "replace")])
        self._dirty["orphans"].add(sample_id)
        self._schedule(ts_us + self.window_us, 1, sample_id)
        return None

    # --- time ---------------------------------------------------------------------------------
    def advance(self, watermark_us: int) -> tuple[list[Closed], list[Rejected]]:
        """Move the watermark (it never goes back) and close what it passes: the impressions whose
        window ended (returned in no particular order), the orphan clicks that can no longer find
        their impression (rejected), and the memory of emitted ids one window later."""
        if watermark_us <= self.watermark_us:
            return [], []
        self.watermark_us = watermark_us
        closed: list[Closed] = []
        rejected: list[Rejected] = []
        while self._due and self._due[0][0] <= watermark_us:
            at, kind, sid = heapq.heappop(self._due)
            if kind == 0 and sid in self.pending and self.pending[sid]["ts"] + self.window_us == at:
                closed.append(self._close(sid))
            elif kind == 1 and sid in self.orphans and max(c[0] for c in self.orphans[sid]) + self.window_us <= at:
                for _, raw in self.orphans.pop(sid):
                    rejected.append(Rejected(f"click without impression: no impression {sid} arrived within "
                                             "the attribution window", raw.encode()))
                self._dirty["orphans"].add(sid)
            elif kind == 2 and sid in self.done and self.done[sid] + KEEP_DONE_WINDOWS * self.window_us == at:
                del self.done[sid]
                self._dirty["done"].add(sid)
        return closed, rejected

    def _close(self, sid: str) -> Closed:
        p = self.pending.pop(sid)
        t0, t1 = p["ts"], p["ts"] + self.window_us
        label = int(any(t0 <= c <= t1 for c in p["clicks"]))
        self.done[sid] = t0
        self._dirty["pending"].add(sid)
        self._dirty["done"].add(sid)
        self._schedule(t0 + KEEP_DONE_WINDOWS * self.window_us, 2, sid)
        return Closed(sid, p["row"], t0, label, sum(c > t1 for c in p["clicks"]))

    # --- changelog ----------------------------------------------------------------------------
    def changes(self) -> dict[str, Any]:
        """What changed since the last call, as JSON-able data (None = removed)."""
        out: dict[str, Any] = {"watermark": self.watermark_us}
        for name in ("pending", "orphans", "done"):
            table = getattr(self, name)
            out[name] = {k: table.get(k) for k in self._dirty[name]}
            self._dirty[name].clear()
        return out

    def apply(self, delta: dict[str, Any]) -> None:
        """Replay a `changes()` record (restore after a restart or a rebalance)."""
        self.watermark_us = max(self.watermark_us, int(delta.get("watermark", NO_TIME)))
        for name in ("pending", "orphans", "done"):
            table = getattr(self, name)
            for k, v in delta.get(name, {}).items():
                if v is None:
                    table.pop(k, None)
                else:
                    table[k] = v

    def reschedule(self) -> None:
        """Rebuild the due-heap from the tables (after `apply`)."""
        self._due = [(p["ts"] + self.window_us, 0, k) for k, p in self.pending.items()]
        self._due += [(max(c[0] for c in cs) + self.window_us, 1, k) for k, cs in self.orphans.items()]
        self._due += [(t + KEEP_DONE_WINDOWS * self.window_us, 2, k) for k, t in self.done.items()]
        heapq.heapify(self._due)

    @property
    def size(self) -> int:
        return len(self.pending) + len(self.orphans) + len(self.done)


def _iso(us: int) -> str:
    from datetime import datetime, timezone

    if us <= NO_TIME:
        return "(none yet)"
    return datetime.fromtimestamp(us / US_PER_S, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
