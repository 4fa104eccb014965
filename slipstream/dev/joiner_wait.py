"""Waiting for the local joiner to turn a replayed raw stream into samples, with a deadline, and
saying what it dead-lettered and why when it made fewer samples than impressions.

The wait reads the joiner's /health: samples committed, impressions taken, dead letters by
reason, input lag. It ends when every impression became a committed sample, when the joiner has
read all its input and made no new sample for `stall_s` (it will not make more), or at the
deadline. `JoinerOutcome.explain()` names the dead letters by reason with examples read from the
dead-letter topics (their `reason` header), and whether every impression is accounted for
(committed, or dead-lettered with a reason).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from slipstream.stream.kafka import Broker, consumer_config

log = logging.getLogger(__name__)

STALL_S = 30.0
DEADLINE_S = 600.0
EXAMPLES = 2


@dataclass
class JoinerOutcome:
    expected: int
    """Samples the replayed impressions should make (one per impression)."""
    committed: int = 0
    impressions_taken: int = 0
    """Impressions the joiner accepted (the rest went to the dead-letter topic)."""
    dead_letters: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    """Dead letters per kind of reason (impressions and clicks)."""
    examples: dict[str, list[str]] = field(default_factory=dict)
    """Dead-letter topic -> a few full reasons read from it."""
    lag: int = 0
    waited_s: float = 0.0
    ended_by: str = "done"
    """done (every sample committed), stalled (input read, nothing new for a while) or deadline."""

    @property
    def impressions_dead(self) -> int:
        return max(0, self.expected - self.impressions_taken) if self.lag == 0 else 0

    @property
    def accounted(self) -> bool:
        """Every impression became a committed sample or a dead letter with its reason."""
        return self.committed + self.impressions_dead >= self.expected

    def explain(self) -> str:
        if self.committed >= self.expected:
            return f"the joiner committed all {self.expected:,} samples"
        why = ", ".join(f"{kind}: {n:,}" for kind, n in sorted(self.reasons.items(), key=lambda kv: -kv[1])) or "none"
        text = (f"the joiner committed {self.committed:,} of {self.expected:,} samples "
                f"({self.ended_by} after {self.waited_s:.0f}s, input lag {self.lag:,}); it dead-lettered "
                f"{self.dead_letters:,} records ({self.impressions_dead:,} of them impressions) — by reason: {why}")
        for topic, reasons in self.examples.items():
            text += "; e.g. on " + topic + ": " + " | ".join(reasons)
        return text


def read_health(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return dict(json.loads(r.read()))
    except (OSError, ValueError):
        return None


def wait_for_joiner(health_url: str, expected: int, *, broker: Broker | None = None, dlq_topics: tuple[str, ...] = (),
                    deadline_s: float = DEADLINE_S, stall_s: float = STALL_S) -> JoinerOutcome:
    """Wait until the joiner has committed `expected` samples, has stalled, or the deadline passed."""
    out = JoinerOutcome(expected)
    started = time.monotonic()
    last_change, last_log, last_committed = started, 0.0, -1
    while True:
        now = time.monotonic()
        snap = read_health(health_url)
        if snap is not None:
            out.committed = int(snap.get("samples_committed", 0))
            out.impressions_taken = int(snap.get("impressions", 0))
            out.dead_letters = int(snap.get("dead_letters", 0))
            out.reasons = dict(snap.get("dead_letter_reasons") or {})
            out.lag = int(snap.get("lag", 0))
        if out.committed != last_committed:
            last_committed, last_change = out.committed, now
        if out.committed >= expected:
            out.ended_by = "done"
            break
        if snap is not None and out.lag == 0 and now - last_change >= stall_s:
            out.ended_by = "stalled"
            break
        if now - started >= deadline_s:
            out.ended_by = "deadline"
            break
        if now - last_log >= 10:
            rate = out.committed / max(now - started, 1e-9)
            eta = (expected - out.committed) / rate if rate > 0 else float("nan")
            log.info("waiting for the joiner: %d of %d samples committed (%.0f/s, ETA %.0fs), %d dead letters, "
                     "input lag %d", out.committed, expected, rate, eta, out.dead_letters, out.lag)
            last_log = now
        time.sleep(0.5)
    out.waited_s = time.monotonic() - started
    if out.committed < expected and broker is not None:
        out.examples = {t: ex for t in dlq_topics if (ex := dead_letter_reasons(broker, t))}
    return out


def dead_letter_reasons(broker: Broker, topic: str, limit: int = EXAMPLES, timeout_s: float = 5.0) -> list[str]:
    """The `reason` headers of the first few records of a dead-letter topic (committed ones)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer(consumer_config(broker, group="slipstream-demo-dlq"))
    try:
        meta = c.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        tps = [TopicPartition(topic, p, 0) for p in sorted(meta.partitions)]
        ends = {tp.partition: c.get_watermark_offsets(tp, timeout=timeout_s, cached=False)[1] for tp in tps}
        c.assign(tps)
        out: list[str] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < limit and time.monotonic() < deadline:
            if all(tp.offset >= ends[tp.partition] for tp in c.position(tps)):
                break
            for m in c.consume(limit, timeout=0.5):
                if m.error() is None:
                    headers = m.headers() or []
                    pairs = headers.items() if isinstance(headers, dict) else headers
                    out += [_text(v) for k, v in pairs if k == "reason" and v is not None]
        return out[:limit]
    except KafkaException as e:
        log.warning("could not read the dead letters of %s: %s", topic, e)
        return []
    finally:
        c.close()


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
