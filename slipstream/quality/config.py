"""Thresholds and severities of the quality gate, parsed once and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field

from slipstream.errors import ConfigError

SEVERITIES = ("critical", "warning")


@dataclass(frozen=True, kw_only=True)
class GateConfig:
    row_count_tolerance: float = 0.3
    """A day's rows must be within ±this fraction of the trailing mean daily rows."""
    history_days: int = 7
    """Days before the checked one that make the trailing mean (row count, drift reference)."""
    ctr_min: float = 0.005
    ctr_max: float = 0.6
    """Click-through rate bounds: outside them the click join or the logging is broken."""
    max_distinct: dict[str, int] = field(
        default_factory=lambda: {"device_hash": 64, "country_hash": 300, "category_hash": 10_000}
    )
    """Upper bound on distinct values per categorical column (a hashing or parsing bug explodes it)."""
    min_distinct: int = 2
    """Fewer distinct values than this in a categorical column means a constant feature."""
    max_empty_history_fraction: float = 0.95
    """Share of rows whose sequence feature is empty above which the sequence join looks broken."""
    psi_threshold: float = 0.2
    """Population stability index above which a numeric feature has drifted (0.1 slight, 0.25 major)."""
    js_threshold: float = 0.1
    """Jensen–Shannon divergence (base 2) above which a categorical feature has drifted."""
    data_docs: bool = True
    """Also render Great Expectations Data Docs of the validation (GX's site builder) under
    `<runs_dir>/<run_id>/quality/gx_data_docs/<scope>/`; they are rendered while the results are
    committed, so off saves ~0.05-0.1 s of CPU per gate (GX's templates are compiled once per
    process)."""
    severity: dict[str, str] = field(default_factory=dict)
    """Override the severity of a check by its name or name prefix, e.g. {"ctr": "warning",
    "drift.": "critical"}. The longest matching key wins."""
    defaults: dict[str, str] = field(
        default_factory=lambda: {
            "": "critical",
            "distinct.": "warning",
            "sequence.empty_fraction": "warning",
            "drift.": "warning",
        }
    )

    def __post_init__(self) -> None:
        if not 0 < self.row_count_tolerance < 1:
            raise ConfigError(f"row_count_tolerance must be in (0, 1), got {self.row_count_tolerance}")
        if not 0 <= self.ctr_min < self.ctr_max <= 1:
            raise ConfigError(f"need 0 <= ctr_min < ctr_max <= 1, got {self.ctr_min}, {self.ctr_max}")
        if self.history_days < 1:
            raise ConfigError(f"history_days must be >= 1, got {self.history_days}")
        for key, sev in {**self.defaults, **self.severity}.items():
            if sev not in SEVERITIES:
                raise ConfigError(f"severity of {key!r} must be one of {SEVERITIES}, got {sev!r}")

    def severity_of(self, check: str) -> str:
        table = {**self.defaults, **self.severity}
        best = max((k for k in table if check.startswith(k)), key=len)
        return table[best]
