"""What one run of the quality gate found: its scope, counts, each check's result and the drift."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from slipstream.quality.bounds import GateBounds
from slipstream.quality.drift import FeatureShift
from slipstream.quality.profiles import FeatureProfile
from slipstream.quality.suites import CheckResult


@dataclass
class GateResult:
    run_id: str
    scope: str
    """`day:YYYY-MM-DD` or `window:START/END`."""
    snapshot_id: int
    start: datetime
    end: datetime
    rows: int
    results: list[CheckResult]
    drift: list[FeatureShift] = field(default_factory=list)
    html_path: Path | None = None
    """Our one-page summary; GX Data Docs are in `data_docs` when enabled."""
    data_docs: Path | None = None
    seconds: float = 0.0
    profile: FeatureProfile | None = None
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per stage: read, profile (with aggregates), day_profiles (window mode: the profiles
    of the window's days not stored yet), history (drift against the stored profiles, the learned
    bounds), validate (GX), persist (Iceberg), and data_docs (rendering GX Data Docs after the
    Iceberg writes, when enabled)."""
    bounds: GateBounds | None = None
    """The CTR and row-count bounds the gate used, with where each end came from (param, learned
    from N days, spec)."""
    empty_days: list[date] = field(default_factory=list)
    """Window mode: the days of the window without rows (a warning, `days.nonempty`)."""

    @property
    def critical_failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.success and r.severity == "critical"]

    @property
    def warnings(self) -> list[CheckResult]:
        return [r for r in self.results if not r.success and r.severity == "warning"]

    @property
    def passed(self) -> bool:
        return not self.critical_failures

    def to_dict(self) -> dict[str, Any]:
        """A small summary (fit for an XCom): no data, no profile."""
        return {
            "run_id": self.run_id, "scope": self.scope, "snapshot_id": self.snapshot_id,
            "rows": self.rows, "passed": self.passed, "seconds": round(self.seconds, 3),
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
            "critical_failures": [r.line() for r in self.critical_failures],
            "warnings": [r.line() for r in self.warnings],
            "html": str(self.html_path) if self.html_path else None,
            "data_docs": str(self.data_docs) if self.data_docs else None,
            "bounds": self.bounds.to_dict() if self.bounds else None,
            "empty_days": [d.isoformat() for d in self.empty_days],
        }
