"""The gate's data-set bounds (CTR, rows against the trailing days) and where each end comes from.

Three sources, the first that sets an end wins:
1. a run's **param** (`gate_ctr_min`, `gate_ctr_max`, `gate_rows_ratio_min`, `gate_rows_ratio_max`
   of the DAG; null: not set);
2. bounds **learned** from the table's own history, when the spec's `quality.learn_from_days` > 0
   and the history holds at least `GateConfig.learn_min_days` days: the low and high quantiles of
   the daily values (each day's rows over its trailing mean; each day's label rate), widened by
   `learn_margin`, and kept inside the spec's bounds where the spec sets them (learning tightens
   a data set's bounds to what its history shows, never loosens them past what its owner wrote);
3. the **spec**'s `quality.ctr` / `quality.row_count_ratio`.
An end none of them sets is open.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, Mapping

import numpy as np

from slipstream.errors import ConfigError
from slipstream.quality.config import GateConfig
from slipstream.samples.spec import QualitySpec

SPEC = "spec"
NONE = "none"


@dataclass(frozen=True)
class Bound:
    """[lo, hi] with the source of each end: `spec`, `learned from N days`, `param NAME`, `none`."""

    lo: float | None
    hi: float | None
    lo_from: str = NONE
    hi_from: str = NONE

    @property
    def sources(self) -> str:
        """Where the ends come from, for a check's expected value: `spec`, or `min: param
        gate_ctr_min, max: learned from 21 days`."""
        if self.lo_from == self.hi_from:
            return self.lo_from
        return ", ".join(f"{end}: {src}" for end, src in (("min", self.lo_from), ("max", self.hi_from)) if src != NONE)

    def to_dict(self) -> dict[str, Any]:
        return {"min": self.lo, "max": self.hi, "min_from": self.lo_from, "max_from": self.hi_from}


@dataclass(frozen=True)
class GateBounds:
    """The bounds one gate used."""

    ctr: Bound
    row_count_ratio: Bound

    def to_dict(self) -> dict[str, Any]:
        return {"ctr": self.ctr.to_dict(), "row_count_ratio": self.row_count_ratio.to_dict()}


@dataclass(frozen=True, kw_only=True)
class GateOverrides:
    """A run's own bounds (the DAG's params); None: not overridden."""

    ctr_min: float | None = None
    ctr_max: float | None = None
    rows_ratio_min: float | None = None
    rows_ratio_max: float | None = None

    PARAMS = {"ctr_min": "gate_ctr_min", "ctr_max": "gate_ctr_max",
              "rows_ratio_min": "gate_rows_ratio_min", "rows_ratio_max": "gate_rows_ratio_max"}
    """Attribute -> the DAG param (knob) that sets it."""

    def __post_init__(self) -> None:
        for attr, lo, hi in (("ctr", self.ctr_min, self.ctr_max), ("rows_ratio", self.rows_ratio_min, self.rows_ratio_max)):
            if lo is not None and hi is not None and not lo < hi:
                raise ConfigError(f"gate_{attr}_min must be < gate_{attr}_max, got {lo} and {hi}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | Any | None) -> "GateOverrides":
        """From DAG params or a `TrainRequest` (anything with the knobs as keys or attributes)."""
        if params is None:
            return cls()
        get = params.get if isinstance(params, Mapping) else (lambda k: getattr(params, k, None))
        return cls(**{attr: (None if get(knob) is None else float(get(knob))) for attr, knob in cls.PARAMS.items()})


@dataclass(frozen=True)
class Learned:
    """Bounds learned from the history, each with the number of days it came from (None: too few)."""

    ctr: tuple[float, float, int] | None = None
    row_count_ratio: tuple[float, float, int] | None = None


def trailing_ratios(counts: Mapping[date, int], history_days: int) -> dict[date, float]:
    """Each day's rows over the mean rows of the days with data among its `history_days` days
    before; days without data are neither a ratio nor part of a mean."""
    out = {}
    for d, n in counts.items():
        before = [counts[d - timedelta(days=k)] for k in range(1, history_days + 1) if d - timedelta(days=k) in counts]
        if before and n:
            out[d] = n / (sum(before) / len(before))
    return out


def _learn(values: list[float], config: GateConfig, upper: float | None) -> tuple[float, float, int] | None:
    if len(values) < config.learn_min_days:
        return None
    lo, hi = np.quantile(np.asarray(values, dtype=np.float64), config.learn_quantiles)
    m = config.learn_margin
    lo, hi = float(lo) * (1 - m), float(hi) * (1 + m)
    return lo, (hi if upper is None else min(hi, upper)), len(values)


def learn_bounds(
    quality: QualitySpec, config: GateConfig, day_counts: Mapping[date, int], day_ctrs: Mapping[date, float],
    before: date,
) -> Learned:
    """Bounds learned from the `quality.learn_from_days` days before `before`: `day_counts` are
    rows per day (days without data absent; it should reach `history_days` further back, for the
    first days' trailing means), `day_ctrs` the label rate per day (stored profiles)."""
    n = quality.learn_from_days
    if n <= 0:
        return Learned()
    first = before - timedelta(days=n)
    ratios = [r for d, r in trailing_ratios(day_counts, quality.history_days).items() if first <= d < before]
    ctrs = [c for d, c in day_ctrs.items() if first <= d < before and c == c]
    return Learned(ctr=_learn(ctrs, config, 1.0), row_count_ratio=_learn(ratios, config, None))


def _end(param: tuple[float | None, str], learned: float | None, days: int, spec: float | None,
         keep_inside: tuple[float | None, float | None]) -> tuple[float | None, str]:
    value, name = param
    if value is not None:
        return value, f"param {name}"
    if learned is not None:
        lo, hi = keep_inside
        inside = min(max(learned, lo if lo is not None else learned), hi if hi is not None else learned)
        return inside, f"learned from {days} days"
    if spec is not None:
        return spec, SPEC
    return None, NONE


def _bound(name: str, params: tuple[tuple[float | None, str], tuple[float | None, str]],
           learned: tuple[float, float, int] | None, spec: tuple[float | None, float | None]) -> Bound:
    lo_l, hi_l, days = learned if learned is not None else (None, None, 0)
    lo, lo_from = _end(params[0], lo_l, days, spec[0], spec)
    hi, hi_from = _end(params[1], hi_l, days, spec[1], spec)
    if lo is not None and hi is not None and lo > hi:
        raise ConfigError(
            f"the gate's {name} bounds cross: min {lo:g} ({lo_from}) > max {hi:g} ({hi_from}); "
            f"set both {params[0][1]} and {params[1][1]} for this run"
        )
    return Bound(lo, hi, lo_from, hi_from)


def resolve_bounds(quality: QualitySpec, learned: Learned, overrides: GateOverrides) -> GateBounds:
    """Each end: the param when set, else the learned bound (kept inside the spec's), else the spec's."""
    p = GateOverrides.PARAMS
    return GateBounds(
        ctr=_bound("ctr", ((overrides.ctr_min, p["ctr_min"]), (overrides.ctr_max, p["ctr_max"])),
                   learned.ctr, (quality.ctr_min, quality.ctr_max)),
        row_count_ratio=_bound("row_count_ratio", ((overrides.rows_ratio_min, p["rows_ratio_min"]), (overrides.rows_ratio_max, p["rows_ratio_max"])),
                               learned.row_count_ratio, (quality.row_count_ratio_min, quality.row_count_ratio_max)),
    )
