"""How many requests a warmup keeps in flight (`SLIPSTREAM_CACHE_CONCURRENCY=auto`).

Little's law: to serve X requests/s when each one waits L seconds for the store, X * L requests
must be in flight. L is measured (the shortest request seen: the round trip plus the store's own
time, without queueing) and so is X; AUTO_BASE more keep the node busy while the store answers.
That is the floor. Above it the target doubles while each doubling still raises the rate by GAIN;
the first doubling that does not is undone and the climb ends: what the shortest request does
not show (a CPU shared with other work, a store that queues, the fewer wake-ups per request a
busier server needs) is found by trying, and a step too far (more threads than pay: they cost the
client CPU) is taken back. On this 2-core machine at 5 ms the raw rate went up 23 % from 32 to 64
in flight and 6 % more at 128, though Little's law with the shortest request asks for about 45;
the warmup itself was fastest at 64 (its threads do more than a raw GET: 128 cost 20 % more CPU
per file). The knee (the last target whose step paid) is remembered per store in the cache: the
next warmup starts there and tries one step up.

A step up is only tried while enough requests are left to measure it (2 x CONTROL_S at the
current rate): a step whose outcome would not be known before the warmup ends can only cost.
Unless the warmup is bound by the round trip: when the requests' own round trips fill most of
the slots (rate x shortest request >= LATENCY_BOUND x target), more slots are more requests
answered, as Little's law says, and cost the client little (its threads wait on the network), so
the step is taken without a measurement and kept as the knee. At 50 ms a short warmup stayed at
128 in flight while raw GETs ran fastest at 256; at 5 ms the round trips fill a third of 64 slots
(the client's CPU is the bound there) and nothing changes.
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

AUTO_BASE = 64
"""Requests in flight that keep a node busy when the store answers at once (auto's floor)."""
CONTROL_S = 0.5
"""Shortest interval over which a rate is measured (shorter ones were too noisy on a shared machine)."""
GAIN = 0.10
"""A step up must raise the rate by this much to be kept."""
STEP = 2.0
"""Each step multiplies the requests in flight by this."""
LATENCY_BOUND = 0.5
"""Share of the slots the round trips fill (rate x shortest request / target) from which the
warmup counts as bound by the round trip."""


@dataclass(slots=True)
class Tally:
    """One worker thread's counts (only that thread writes them: no lock on the hot path)."""

    done: int = 0
    files: int = 0
    bytes: int = 0
    shortest_s: float = math.inf
    kind: str = ""
    at: float = 0.0
    """When the latest request ended (the newest `kind` across threads is the current one)."""

    def record(self, kind: str, seconds: float, nbytes: int, files: int, now: float) -> None:
        self.done += 1
        self.files += files
        self.bytes += nbytes
        self.kind, self.at = kind, now
        if seconds < self.shortest_s:
            self.shortest_s = seconds


@dataclass
class RequestClock:
    """What the workers report: requests and files done, bytes fetched, the shortest request, and
    the kind of the latest (a change of kind starts a new measurement: ranges and small files
    have different rates). Each thread counts in a `Tally` of its own; readers sum them."""

    tallies: list[Tally] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tally(self) -> Tally:
        with self.lock:
            t = Tally()
            self.tallies.append(t)
            return t

    def totals(self) -> Tally:
        with self.lock:
            tallies = list(self.tallies)
        out = Tally()
        for t in tallies:
            out.done += t.done
            out.files += t.files
            out.bytes += t.bytes
            out.shortest_s = min(out.shortest_s, t.shortest_s)
            if t.at > out.at:
                out.kind, out.at = t.kind, t.at
        return out


@dataclass(frozen=True)
class Climb:
    """Where `auto` stands: the target, the last target whose step paid (the knee) and its rate,
    and whether it is still climbing."""

    target: int
    knee: int
    best: float | None = None
    climbing: bool = True


def next_climb(c: Climb, rate: float, shortest_s: float, cap: int) -> Climb:
    """The next state after measuring `rate` requests/s at `c.target`: while climbing, a step that
    raised the rate by GAIN is taken again (doubling); one that did not is undone (back to the
    knee) and the climb ends. Little's law (AUTO_BASE + rate x shortest request) is the floor
    throughout; `cap` the ceiling."""
    if rate <= 0 or not math.isfinite(shortest_s):
        return c
    little = AUTO_BASE + math.ceil(rate * shortest_s)
    if not c.climbing:
        return Climb(min(cap, max(c.target, little)), c.knee, c.best, False)
    if c.best is None or rate >= c.best * (1 + GAIN):  # this step paid: take the next
        return Climb(min(cap, max(little, math.ceil(c.target * STEP))), c.target, rate, True)
    return Climb(min(cap, max(c.knee, little)), c.knee, c.best, False)


class InFlight:
    """The target number of requests in flight; `update()` is called about every CONTROL_S."""

    def __init__(self, fixed: int | None, cap: int, start: int | None = None) -> None:
        self.fixed = fixed
        self.cap = cap
        self.clock = RequestClock()
        first = fixed if fixed is not None else min(cap, max(AUTO_BASE, start or 0))
        self.climb = Climb(first, first)
        self._since = (time.monotonic(), 0, "")

    @property
    def target(self) -> int:
        return self.climb.target

    @property
    def knee(self) -> int:
        """The last target whose step paid: what the next warmup of this store starts at."""
        return self.climb.knee

    def update(self, left: int | None = None) -> int:
        """`left`: requests not yet started (None: unknown), so no step up is tried that could not
        be measured before the end."""
        if self.fixed is not None:
            return self.target
        now = time.monotonic()
        t0, done0, kind0 = self._since
        totals = self.clock.totals()
        done, shortest, kind = totals.done, totals.shortest_s, totals.kind
        if kind != kind0 and kind0:  # a new kind of request (ranges, then small files): climb anew from here
            self._since, self.climb = (now, done, kind), Climb(self.target, self.target)
            return self.target
        if now - t0 < CONTROL_S or done - done0 < min(self.target, 64):
            return self.target
        rate = (done - done0) / (now - t0)
        self._since = (now, done, kind)
        climb = next_climb(self.climb, rate, shortest, self.cap)
        if climb.climbing and climb.target > self.target and left is not None and left < 2 * CONTROL_S * rate:
            if rate * shortest >= LATENCY_BOUND * self.target:  # bound by the round trip: the step pays by itself
                climb = Climb(climb.target, climb.target, climb.best, False)
            else:  # this step paid; the next would not be measured
                climb = Climb(self.target, climb.knee, climb.best, False)
        if climb.target != self.target:
            log.debug("warm: %d -> %d requests in flight (%.0f %s requests/s, shortest %.1f ms%s)", self.target,
                      climb.target, rate, kind, shortest * 1000, "" if climb.climbing else ", settled")
        self.climb = climb
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
