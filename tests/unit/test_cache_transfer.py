"""The warmup's transfer policy without a store: how many requests it keeps in flight, how long
it retries store errors, and which errors it does not retry."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from slipstream.cache.inflight import AUTO_BASE, Climb, InFlight, next_climb, remember, remembered
from slipstream.cache.s3get import RequestRefused
from slipstream.cache.transfer import Stopped, with_retries


def _settle(rate_at: callable, start: int = AUTO_BASE, shortest_s: float = 0.051, cap: int = 1024,
            steps: int = 12) -> list[int]:
    climb, seen = Climb(start, start), []
    for _ in range(steps):
        climb = next_climb(climb, rate_at(climb.target), shortest_s, cap)
        seen.append(climb.target)
    return seen


def test_latency_bound_rates_climb_to_the_knee_and_a_step_too_far_is_undone() -> None:
    """A store 50 ms away, requests one at a time per thread: the rate grows with the requests in
    flight until the node saturates at 2,000/s (about 102 in flight)."""
    seen = _settle(lambda n: min(n / 0.051, 2000.0))
    assert seen[:2] == [128, 256], "doubling while each step pays"
    little = AUTO_BASE + math.ceil(2000 * 0.051)  # 166: above the knee (128)
    assert seen[-1] == little and seen[-1] == seen[-2] == seen[-5], "the step to 256 did not pay: back, settled"


def test_cpu_bound_rates_stop_after_one_step_and_little_is_the_floor() -> None:
    flat = _settle(lambda n: 1000.0, start=64, shortest_s=0.004)
    floor = AUTO_BASE + 4  # Little's law: 1,000/s x 4 ms
    assert flat[0] == 128 and flat[1:] == [floor] * 11, "the first step did not pay: back to the floor"
    long_rtt = _settle(lambda n: 1000.0, start=32, shortest_s=0.1)
    assert min(long_rtt[1:]) >= AUTO_BASE + 100, "Little's law: 1,000/s x 100 ms in flight, at least"
    assert _settle(lambda n: 1e6, start=200, shortest_s=0.1, cap=256)[-1] == 256, "never past the cap"
    assert next_climb(Climb(40, 40), 0.0, math.inf, 256) == Climb(40, 40), "nothing measured yet: no change"


def test_the_first_half_second_counts_and_no_step_is_tried_that_the_end_would_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """1,000 small files/s measured over the first second: with 10,000 requests left `auto` tries a
    step up at once (the first kind of request needs no warm-up period of its own); with 100 left
    (0.1 s) it keeps the target: the step could not be measured before the warmup ends."""
    from slipstream.cache import inflight

    now = [100.0]
    monkeypatch.setattr(inflight.time, "monotonic", lambda: now[0])
    plenty, short = InFlight(None, 512), InFlight(None, 512)
    for f in (plenty, short):
        tally = f.clock.tally()
        for _ in range(1000):
            tally.record("pack", 0.005, 20_000, 1, now[0])
    now[0] += 1.0
    assert plenty.update(left=10_000) == 2 * AUTO_BASE
    assert short.update(left=100) == AUTO_BASE and short.knee == AUTO_BASE


def test_a_short_warmup_bound_by_the_round_trip_steps_up_without_measuring(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 50 ms, 64 slots answer ~1,280 requests/s: the round trips fill every slot, so a short
    warmup doubles at once and keeps it as the knee; at 5 ms the same rate fills a tenth of them
    (the client's CPU is the bound) and the short warmup keeps its target."""
    from slipstream.cache import inflight

    now = [100.0]
    monkeypatch.setattr(inflight.time, "monotonic", lambda: now[0])
    far, near = InFlight(None, 512), InFlight(None, 512)
    for f, shortest in ((far, 0.050), (near, 0.005)):
        tally = f.clock.tally()
        for _ in range(1280):
            tally.record("pack", shortest, 20_000, 1, now[0])
    now[0] += 1.0
    assert far.update(left=500) == 2 * AUTO_BASE and far.knee == 2 * AUTO_BASE
    assert near.update(left=500) == AUTO_BASE and near.knee == AUTO_BASE


def test_fixed_concurrency_is_not_adjusted_and_auto_starts_at_the_remembered_knee(tmp_path: Path) -> None:
    fixed = InFlight(8, 256)
    fixed.clock.tally().record("pack", 0.001, 100, 1, 1.0)
    assert fixed.update() == 8 and fixed.target == 8
    assert remembered(tmp_path, "http://s3") is None
    remember(tmp_path, "http://s3", 256)
    remember(tmp_path, "http://other", 64)
    assert remembered(tmp_path, "http://s3") == 256
    assert InFlight(None, 512, remembered(tmp_path, "http://s3")).target == 256  # the last knee
    assert InFlight(None, 512, remembered(tmp_path, "http://other")).target == 64
    assert InFlight(None, 512, None).target == AUTO_BASE
    (tmp_path / "inflight.json").write_text("not json")
    assert remembered(tmp_path, "http://s3") is None  # a damaged record is ignored


class FakeTime:
    """A clock that the retries' waits advance (no real sleeping)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return False


def _down_until(t: FakeTime, back_at: float, error: OSError) -> callable:
    def fetch() -> str:
        if t.now < back_at:
            raise error
        return "bytes"
    return fetch


def test_retries_outlast_a_store_restart_longer_than_the_old_budget() -> None:
    """The old budget was 4 tries in 3.5 s; a store that is back after 30 s is waited for."""
    t = FakeTime()
    out = with_retries("s3://b/k", _down_until(t, 30.0, ConnectionRefusedError("refused")), budget_s=120,
                       wait=t.wait, clock=t.clock)
    assert out == "bytes" and 30.0 <= t.now < 40.0
    assert max(t.waits) <= 8.0, "the backoff is capped: the store is tried again soon after it is back"


def test_retries_give_up_after_the_budget_and_not_on_permanent_errors() -> None:
    t = FakeTime()
    with pytest.raises(ConnectionResetError):
        with_retries("s3://b/k", _down_until(t, 1e9, ConnectionResetError("reset")), budget_s=20,
                     wait=t.wait, clock=t.clock)
    assert 10.0 <= t.now <= 20.0
    for permanent in (FileNotFoundError("HTTP 404"), RequestRefused("HTTP 403")):
        t = FakeTime()
        with pytest.raises(type(permanent)):
            with_retries("s3://b/k", _down_until(t, 1e9, permanent), budget_s=120, wait=t.wait, clock=t.clock)
        assert t.waits == [], f"{permanent!r} is not retried"


def test_a_warmup_being_torn_down_abandons_its_retries() -> None:
    t = FakeTime()
    with pytest.raises(Stopped):
        with_retries("s3://b/k", _down_until(t, 1e9, ConnectionRefusedError("refused")), budget_s=120,
                     wait=lambda s: True, clock=t.clock)
