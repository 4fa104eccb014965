"""Drift over days: each day's features against its trailing days, judged against how much each
feature usually moves from day to day (`movement`), and summed up as one line per feature.

Every day with rows is scored against the merged counts of its trailing `history_days` days with
rows; a day's *excess* (distance above chance at its size) joins the baseline of the days after
it. A tested day alarms on a feature when its distance is past both chance and the feature's
usual excess over the `baseline_days` before it. Everything works on per-day bin counts drawn
from the stored profiles (`binning`), so a month of days costs a few vector sums per feature.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import TypeVar

import numpy as np

from slipstream.quality.binning import Bins, bins_of
from slipstream.quality.drift import FeatureShift, drift_features
from slipstream.quality.movement import Chance, MovementConfig, Usual, chance, distance, limit, usual_movement
from slipstream.quality.profiles import ColumnProfile, FeatureProfile
from slipstream.quality.wording import shift_detail
from slipstream.samples.spec import Spec

K = TypeVar("K", bound=Hashable)


def feature_bins(profiles: Mapping[K, FeatureProfile], spec: Spec, basis: Sequence[K]) -> dict[str, Bins]:
    """Each drift feature's bins, drawn from the profiles of the `basis` days (or day-hours) taken
    together."""
    out = {}
    for name in drift_features(spec):
        b = bins_of(name, [profiles[d].columns[name] for d in basis if name in profiles[d].columns])
        if b is not None:
            out[name] = b
    return out


@dataclass
class _Day:
    counts: np.ndarray
    ref: np.ndarray | None = None
    score: float = math.nan
    chance: Chance | None = None

    @property
    def excess(self) -> float:
        return self.score - self.chance.mean if self.chance is not None else math.nan


def column_moments(cols: Sequence[ColumnProfile]) -> tuple[float, float, int]:
    """(mean, null or non-finite share, rows) of several days' column profiles taken together."""
    count = sum(c.count for c in cols)
    rows = sum(c.rows for c in cols)
    numeric = all(c.kind in ("numeric", "sequence") for c in cols)
    mean = sum(c.mean * c.count for c in cols) / count if count and numeric else math.nan
    bad = sum(c.nulls + c.nonfinite for c in cols)
    return mean, (bad / rows if rows else 0.0), rows


def drift_over_days(profiles: Mapping[date, FeatureProfile], test_days: Sequence[date], spec: Spec, history_days: int,
                    config: MovementConfig | None = None) -> dict[date, list[FeatureShift]]:
    """The drift verdict of each feature on each of `test_days` (days without rows or without a
    trailing day with rows are left out). `profiles` should reach `history_days` +
    `config.baseline_days` before the first tested day, for its reference and its baseline."""
    config = config or MovementConfig()
    days = sorted(d for d, p in profiles.items() if p.rows)
    tested = sorted(d for d in set(test_days) if d in profiles and profiles[d].rows)
    if not tested:
        return {}
    # bins from the trailing days of the first tested day when it has any: a drift on a tested
    # day does not move the bin edges it is measured with
    basis = [d for d in days if tested[0] - timedelta(days=history_days) <= d < tested[0]] or days
    bins = feature_bins(profiles, spec, basis)
    out: dict[date, list[FeatureShift]] = {d: [] for d in tested}
    judged = set(tested)
    first = tested[0] - timedelta(days=config.baseline_days)
    for name, b in bins.items():
        series = {d: _Day(b.counts(profiles[d].columns.get(name))) for d in days if d >= first - timedelta(days=history_days)}
        for d, day in series.items():
            if d < first:
                continue
            before = [series[k].counts for k in _trailing(d, history_days) if k in series]
            if not before or day.counts.sum() == 0:
                continue
            day.ref = np.sum(before, axis=0)
            day.score = float(distance(b.method, day.ref, day.counts))
            # a day only judged as the past of others needs the null's mean alone: fewer draws
            day.chance = chance(b.method, day.ref, day.counts, config, key=f"{name}|{d}",
                                draws=None if d in judged else config.baseline_draws)
        for d in tested:
            judged_day = series.get(d)
            if judged_day is None or judged_day.chance is None or judged_day.ref is None:
                continue
            past = [series[k].excess for k in series if d - timedelta(days=config.baseline_days) <= k < d]
            out[d].append(_verdict(name, b, judged_day, usual_movement(past, config), profiles, d, history_days, config))
    return {d: v for d, v in out.items() if v}


def _trailing(d: date, history_days: int) -> list[date]:
    return [d - timedelta(days=k) for k in range(1, history_days + 1)]


def _verdict(name: str, b: Bins, day: _Day, usual: Usual, profiles: Mapping[date, FeatureProfile], d: date,
             history_days: int, config: MovementConfig) -> FeatureShift:
    assert day.chance is not None and day.ref is not None
    null = day.chance
    ref_cols = [profiles[k].columns[name] for k in _trailing(d, history_days) if k in profiles and name in profiles[k].columns]
    mean_a, null_a, _ = column_moments(ref_cols)
    mean_b, null_b, _ = column_moments([profiles[d].columns[name]])
    return FeatureShift(name, b.method, day.score, limit(b.method, null, usual, config), mean_a, mean_b, null_a, null_b,
                        rows_a=int(day.ref.sum()), rows_b=int(day.counts.sum()), expected=null.mean,
                        baseline_days=usual.days if usual.known else 0)


@dataclass(frozen=True)
class DriftLine:
    """One feature over the tested days: how many days it moved more than usual, since when, how far."""

    feature: str
    method: str
    days_tested: int
    alarmed: tuple[date, ...]
    worst: FeatureShift
    worst_day: date

    @property
    def drifted(self) -> bool:
        return bool(self.alarmed)

    def text(self) -> str:
        """e.g. `moved more than usual on 3 of 20 days, since 2026-11-12, last 2026-11-14; furthest on
        2026-11-12: JS 0.214 at 1,999 rows vs 14,308 trailing rows; chance ... allow 0.061`."""
        how_far = f"on {self.worst_day}: {shift_detail(self.worst)}"
        if not self.alarmed:
            return f"within its usual movement on all {self.days_tested} days; closest to its limit {how_far}"
        since = f"since {self.alarmed[0]}" + (f", last {self.alarmed[-1]}" if len(self.alarmed) > 1 else "")
        return f"moved more than usual on {len(self.alarmed)} of {self.days_tested} days, {since}; furthest {how_far}"


def summarise(series: Mapping[date, list[FeatureShift]], spec: Spec) -> list[DriftLine]:
    """One line per feature, in spec order: alarmed features first."""
    by_feature: dict[str, list[tuple[date, FeatureShift]]] = {}
    for d in sorted(series):
        for s in series[d]:
            by_feature.setdefault(s.feature, []).append((d, s))
    order = {n: i for i, n in enumerate(drift_features(spec))}
    lines = []
    for name, items in by_feature.items():
        alarmed = tuple(d for d, s in items if s.drifted)
        worst_day, worst = max(items, key=lambda ds: (ds[1].times_limit if ds[1].times_limit == ds[1].times_limit else -1))
        lines.append(DriftLine(name, worst.method, len(items), alarmed, worst, worst_day))
    return sorted(lines, key=lambda ln: (not ln.drifted, order.get(ln.feature, 1 << 20)))
