"""Batch-vs-stream skew on comparable rows.

The stream a run trains on after T covers a few hours of one day; the batch window covers whole
days. Comparing them as they are flags every feature that depends on the hour: a same-day
sequence (`kind: sequence`: the user's earlier items *the same UTC day*) is short in the first
hour after midnight by construction, so a stream of that hour always looks "skewed" against
whole days. So the batch side is the window's rows **at the hours of day the stream covers**
(`stream_hours`), and a feature is flagged only when the stream differs from them more than one
batch day's same hours differ from the other days' (`movement`: chance at these sizes, and the
usual movement across the batch days, leave-one-day-out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

import numpy as np

from slipstream.quality.binning import Bins
from slipstream.quality.drift import FeatureShift
from slipstream.quality.drift_days import column_moments, feature_bins
from slipstream.quality.movement import MovementConfig, chance, distance, limit, usual_movement
from slipstream.quality.profiles import US_PER_HOUR, FeatureProfile
from slipstream.samples.spec import Spec

ALL_HOURS = frozenset(range(24))


def stream_hours(stream: FeatureProfile) -> frozenset[int]:
    """The UTC hours of day the stream's rows fall in (from its CTR per hour; else its event-time
    range; else every hour)."""
    if stream.ctr_by_hour:
        return frozenset(int(h) % 24 for h, (n, _) in stream.ctr_by_hour.items() if n)
    t = stream.columns.get("event_time")
    if t is not None and t.kind == "time" and t.min is not None and t.max is not None:
        first, last = int(t.min) // US_PER_HOUR, int(t.max) // US_PER_HOUR
        if last - first < 24:
            return frozenset(h % 24 for h in range(first, last + 1))
    return ALL_HOURS


@dataclass(frozen=True)
class SkewResult:
    shifts: list[FeatureShift]
    hours: frozenset[int]
    """The hours of day the batch side was taken from (every hour: whole days)."""
    days: tuple[date, ...]
    """The batch days compared (each one's rows at `hours`)."""

    @property
    def skewed(self) -> list[FeatureShift]:
        return [s for s in self.shifts if s.drifted]

    def hours_text(self) -> str:
        if self.hours == ALL_HOURS:
            return "whole days"
        hs = sorted(self.hours)
        return ", ".join(f"{h:02d}:00-{h + 1:02d}:00" for h in hs) + " UTC"


def same_day_features(spec: Spec) -> frozenset[str]:
    """Features whose value depends on the hour by construction (same-day sequences)."""
    return frozenset(f.name for f in spec.features if f.kind == "sequence")


def batch_vs_stream(slices: Mapping[tuple[date, int], FeatureProfile], stream: FeatureProfile, spec: Spec,
                    hours: frozenset[int], config: MovementConfig | None = None) -> SkewResult:
    """Each feature's skew between the batch rows at `hours` and the stream. `slices` are the batch
    days' rows one profile per (day, UTC hour of day).

    The batch side is the slices at `hours`. What a feature usually moves is measured on slices
    of the same kind as the stream: every (day, hour) slice against all the others, and for a
    same-day feature (whose value depends on the hour) each day's slices at `hours` against the
    other days' at `hours`."""
    config = config or MovementConfig()
    keys = sorted(k for k, p in slices.items() if p.rows)
    matched = [k for k in keys if k[1] in hours]
    days = tuple(sorted({d for d, _ in matched}))
    if not matched or not stream.rows:
        return SkewResult([], hours, days)
    bins = feature_bins(slices, spec, matched)
    same_day = same_day_features(spec)
    shifts = []
    for name, b in bins.items():
        counts = {k: b.counts(slices[k].columns.get(name)) for k in keys}
        if name in same_day:
            groups = {d: np.sum([counts[k] for k in matched if k[0] == d], axis=0) for d in days}
        else:
            groups = dict(counts)
        s = _feature_skew(name, b, counts, matched, groups, slices, stream, config)
        if s is not None:
            shifts.append(s)
    return SkewResult(shifts, hours, days)


def _feature_skew(name: str, b: Bins, counts: Mapping[tuple[date, int], np.ndarray], matched: list[tuple[date, int]],
                  groups: Mapping[Any, np.ndarray], slices: Mapping[tuple[date, int], FeatureProfile],
                  stream: FeatureProfile, config: MovementConfig) -> FeatureShift | None:
    total = np.sum([counts[k] for k in matched], axis=0)
    cur = b.counts(stream.columns.get(name))
    if total.sum() == 0 or cur.sum() == 0:
        return None
    everything = np.sum(list(groups.values()), axis=0)
    excess = []
    for g, part in groups.items():
        rest = everything - part
        if part.sum() and rest.sum():
            null = chance(b.method, rest, part, config, key=f"skew|{name}|{g}", draws=config.baseline_draws)
            excess.append(float(distance(b.method, rest, part)) - null.mean)
    null = chance(b.method, total, cur, config, key=f"skew|{name}")
    usual = usual_movement(excess, config, units=len({k[0] for k in matched}))
    mean_a, null_a, _ = column_moments([slices[k].columns[name] for k in matched if name in slices[k].columns])
    mean_b, null_b, _ = column_moments([stream.columns[name]])
    return FeatureShift(name, b.method, float(distance(b.method, total, cur)), limit(b.method, null, usual, config),
                        mean_a, mean_b, null_a, null_b, rows_a=int(total.sum()), rows_b=int(cur.sum()),
                        expected=null.mean, baseline_days=usual.days if usual.known else 0)
