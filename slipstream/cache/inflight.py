"""How many requests a warmup keeps in flight (`SLIPSTREAM_CACHE_CONCURRENCY=auto`).

Little's law: to serve X requests/s when each one waits L seconds for the store, X * L requests
must be in flight. L is measured (the shortest request seen: the round trip plus the store's own
time, without queueing) and so is X; AUTO_BASE more keep the node busy while the store answers.
That is the floor. Above it the target doubles while each doubling still raises the rate by GAIN
(what a full link, a busy store or a busy CPU stops): what the shortest request does not show (a
CPU shared with other work, a store that queues, the fewer wake-ups per request a busier server
needs) is found by trying. On this 2-core machine at 5 ms the raw rate went up 42 % from 32 to 64
in flight, though Little's law with the shortest request asks for about 45. The target never
shrinks during a warmup (a waiting thread costs little). The last target whose step paid (the
knee) is remembered per store in the cache: the next warmup starts there and tries one step up.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

AUTO_BASE = 32
"""Requests in flight that keep a node busy when the store answers at once (auto's floor)."""
CONTROL_S = 0.25
"""Shortest interval over which a rate is measured."""
GAIN = 0.05
"""A step up must raise the rate by this much for the climb to go on."""
STEP = 2.0
"""Each step multiplies the requests in flight by this."""


@dataclass
class RequestClock:
    """What the workers report: requests and files done, bytes fetched, the shortest request, and
    the kind of the latest (a change of kind starts a new measurement: ranges and small files
    have different rates)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    done: int = 0
    files: int = 0
    bytes: int = 0
    shortest_s: float = math.inf
    kind: str = ""

    def record(self, kind: str, seconds: float, nbytes: int, files: int) -> None:
        with self.lock:
            self.done += 1
            self.files += files
            self.bytes += nbytes
            self.kind = kind
            if seconds < self.shortest_s:
                self.shortest_s = seconds


def next_target(target: int, rate: float, best: float | None, shortest_s: float, cap: int
                ) -> tuple[int, float | None]:
    """(new target, best rate so far) after a measurement of `rate` requests/s at `target`; the
    best rate changes only when `target` paid (its rate beat the best by GAIN)."""
    if rate <= 0 or not math.isfinite(shortest_s):
        return target, best
    want = AUTO_BASE + math.ceil(rate * shortest_s)  # Little's law
    if best is None or rate >= best * (1 + GAIN):  # the last step paid: take the next
        want = max(want, math.ceil(target * STEP))
        best = rate
    return max(target, min(cap, want)), best


class InFlight:
    """The target number of requests in flight; `update()` is called about every CONTROL_S."""

    def __init__(self, fixed: int | None, cap: int, start: int | None = None) -> None:
        self.fixed = fixed
        self.cap = cap
        self.clock = RequestClock()
        self.target = fixed if fixed is not None else min(cap, max(AUTO_BASE, start or 0))
        self.knee = self.target
        """The last target whose rate beat the best before it (what the next warmup starts at)."""
        self.best: float | None = None
        self._since = (time.monotonic(), 0, "")

    def update(self) -> int:
        if self.fixed is not None:
            return self.target
        now = time.monotonic()
        t0, done0, kind0 = self._since
        with self.clock.lock:
            done, shortest, kind = self.clock.done, self.clock.shortest_s, self.clock.kind
        if kind != kind0:  # a new kind of request: measure it from here
            self._since, self.best = (now, done, kind), None
            return self.target
        if now - t0 < CONTROL_S or done - done0 < min(self.target, 64):
            return self.target
        rate = (done - done0) / (now - t0)
        self._since = (now, done, kind)
        target, best = next_target(self.target, rate, self.best, shortest, self.cap)
        if best != self.best:
            self.knee, self.best = self.target, best
        if target != self.target:
            log.debug("warm: %d -> %d requests in flight (%.0f %s requests/s, shortest %.1f ms)",
                      self.target, target, rate, kind, shortest * 1000)
            self.target = target
        return self.target


def _state_path(cache_root: Path) -> Path:
    return cache_root / "inflight.json"


def remembered(cache_root: Path, store: str) -> int | None:
    """What the last warmup of this cache against `store` settled on (None: never warmed)."""
    try:
        value = json.loads(_state_path(cache_root).read_text()).get(store)
    except (FileNotFoundError, ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int) and value > 0 else None


def remember(cache_root: Path, store: str, target: int) -> None:
    """Record `target` for `store` (under the warmup's lock: one writer at a time)."""
    path = _state_path(cache_root)
    try:
        state = json.loads(path.read_text())
        state = state if isinstance(state, dict) else {}
    except (FileNotFoundError, ValueError):
        state = {}
    state[store] = target
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)
