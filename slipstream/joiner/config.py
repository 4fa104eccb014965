"""The joiner's settings, parsed once (CLI flags over the Slipstream settings) into one object."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from slipstream.errors import ConfigError
from slipstream.samples.spec import Spec


@dataclass(frozen=True, kw_only=True)
class JoinerConfig:
    impressions_topic: str
    """Raw events (the spec's events source), JSON, keyed by user (co-partitioned with clicks)."""
    clicks_topic: str
    """Raw labels (the spec's click source), JSON, keyed like their impression."""
    samples_topic: str
    """Where the samples go (the trainer's stream), keyed by the spec's key column."""
    group: str
    """Consumer group: every replica of one joiner uses the same; partitions are shared among them."""
    instance: str
    """This replica's stable name (its transactional id): a restarted replica with the same name
    fences its previous self and aborts what it left open at once."""
    codec: str = "json"
    lateness_s: float = 120.0
    """How far behind the newest event time the watermark stays: events may arrive this late."""
    max_future_s: float = 3600.0
    """An event time more than this ahead of the machine's clock is a dead letter (a broken clock
    would otherwise close every window)."""
    max_age_s: float = 400 * 86400.0
    """An event time more than this behind the machine's clock is a dead letter (1971, a 0
    default, a wrong unit); 0: no limit. A replay of older history belongs in the batch path."""
    commit_interval_s: float = 0.25
    """How often a transaction commits (samples become visible to read_committed readers then)."""
    batch: int = 10_000
    """Records taken per consume call."""
    input_idle_s: float = 1.0
    """An input partition at its end still holds the watermark back this long (the click producer
    may be a moment behind the impression producer); then the other input alone drives it."""
    idle_flush_s: float = 0.0
    """> 0: after this many seconds with every input partition at its end, treat the input as
    finished and close every window (replays, demos, tests). 0: the watermark then advances with
    the wall clock instead (live traffic)."""
    health_port: int = 0
    """> 0: serve /health and /metrics on 127.0.0.1:port."""
    partitions: int = 4
    """Partitions of the topics the joiner creates when missing."""

    def __post_init__(self) -> None:
        if self.lateness_s < 0:
            raise ConfigError(f"--lateness-s must be >= 0, got {self.lateness_s}")
        if self.max_age_s < 0:
            raise ConfigError(f"--max-age-s must be >= 0 (0: no limit), got {self.max_age_s}")
        if self.commit_interval_s <= 0:
            raise ConfigError(f"--commit-interval-s must be > 0, got {self.commit_interval_s}")
        if self.impressions_topic == self.clicks_topic:
            raise ConfigError(f"impressions and clicks need their own topics, both are {self.impressions_topic!r}")

    @property
    def state_topic(self) -> str:
        """The changelog of the join state (one partition per input partition)."""
        return f"{self.group}.state"

    def dlq(self, topic: str) -> str:
        return f"{topic}.dlq"

    @classmethod
    def for_spec(cls, spec: Spec, samples_topic: str, **knobs: Any) -> JoinerConfig:
        """Defaults named after the spec: topics = its source names, group = slipstream-joiner-<spec>."""
        if spec.label.kind != "click_within" or spec.label_source is None:
            raise ConfigError(f"the joiner joins clicks to impressions: spec {spec.name} labels by "
                              f"{spec.label.describe()}, which needs no join (produce its samples directly)")
        given = {k: v for k, v in knobs.items() if v not in (None, "")}
        given.setdefault("impressions_topic", spec.events.name)
        given.setdefault("clicks_topic", spec.label_source.name)
        given.setdefault("group", f"slipstream-joiner-{spec.name}")
        given.setdefault("instance", socket.gethostname())
        return cls(samples_topic=samples_topic, **given)
