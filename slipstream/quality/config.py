"""Thresholds and severities of the quality gate, parsed once and passed down."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from slipstream.errors import ConfigError
from slipstream.quality.movement import MovementConfig

SEVERITIES = ("critical", "warning")


@dataclass(frozen=True, kw_only=True)
class GateConfig:
    """How the gate checks, whatever the data set. The data set's own thresholds (CTR and row-count
    bounds, history, distinct counts, severities) are in its spec's `quality:` section
    (`slipstream.quality.bounds` resolves them against learned bounds and a run's params)."""

    min_distinct: int = 2
    """Fewer distinct values than this in a categorical column means a constant feature."""
    max_empty_history_fraction: float = 0.95
    """Share of rows whose sequence feature is empty above which the sequence join looks broken."""
    movement: MovementConfig = field(default_factory=MovementConfig)
    """When a feature's day counts as drifted: past chance at the day's size and past its usual
    day-to-day movement (`slipstream.quality.movement`)."""
    learn_min_days: int = 7
    """Days of history a bound is learned from at least (fewer: the spec's bound holds)."""
    learn_k: float = 4.0
    """A learned label-rate bound lies this many robust standard deviations (`bounds.robust_sd`,
    with the day's own sampling noise) from the history's median rate."""
    learn_k_rows: tuple[float, float] = (3.0, 4.5)
    """A learned row-count bound lies (below, above) this many robust standard deviations of the
    log rows from the rows expected of the day: traffic bursts up, an outage goes down."""
    learn_margin: float = 0.25
    """A learned bound is never narrower than this share of its center: rows within [1 / 1.25,
    1.25] of the expected, the label rate within ±25 % of its median."""
    data_docs: bool = True
    """Also render Great Expectations Data Docs of the validation (GX's site builder) under
    `<runs_dir>/<run_id>/quality/gx_data_docs/<scope>/`; they are rendered while the results are
    committed, so off saves ~0.05-0.1 s of CPU per gate (GX's templates are compiled once per
    process)."""
    severity: dict[str, str] = field(default_factory=dict)
    """Override the severity of a check by its name or name prefix, e.g. {"ctr": "warning",
    "drift.": "critical"}. The longest matching key wins; these win over the spec's `severity`."""
    defaults: dict[str, str] = field(
        default_factory=lambda: {
            "": "critical",
            "distinct.": "warning",
            "sequence.empty_fraction": "warning",
            "drift.": "warning",
            "days.nonempty": "warning",
        }
    )

    def __post_init__(self) -> None:
        if self.min_distinct < 1:
            raise ConfigError(f"min_distinct must be >= 1, got {self.min_distinct}")
        if self.learn_min_days < 2:
            raise ConfigError(f"learn_min_days must be >= 2, got {self.learn_min_days}")
        if self.learn_k <= 0 or min(self.learn_k_rows) <= 0:
            raise ConfigError(f"learn_k and learn_k_rows must be > 0, got {self.learn_k} and {self.learn_k_rows}")
        if not 0 <= self.learn_margin < 1:
            raise ConfigError(f"learn_margin must be in [0, 1), got {self.learn_margin}")
        for key, sev in {**self.defaults, **self.severity}.items():
            if sev not in SEVERITIES:
                raise ConfigError(f"severity of {key!r} must be one of {SEVERITIES}, got {sev!r}")

    def severity_of(self, check: str, data_set: Mapping[str, str] | None = None) -> str:
        """The severity of a check: this config's `severity`, else the data set's (the spec's
        `quality.severity`), else the defaults; the longest matching name prefix wins in each."""
        for table in (self.severity, data_set or {}):
            keys = [k for k in table if check.startswith(k)]
            if keys:
                return table[max(keys, key=len)]
        best = max((k for k in self.defaults if check.startswith(k)), key=len)
        return self.defaults[best]
