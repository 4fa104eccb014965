"""The gate's data-set bounds (label rate, rows against what a day usually holds) and where each
end comes from.

Three sources, the first that sets an end wins:
1. a run's **param** (`gate_ctr_min`, `gate_ctr_max`, `gate_rows_ratio_min`, `gate_rows_ratio_max`
   of the DAG; null: not set);
2. bounds **learned** from the table's own history, when the spec's `quality.learn_from_days` > 0
   and the history holds at least `GateConfig.learn_min_days` days, from robust statistics so
   that bursty traffic passes and an outage does not (`learn_bounds`), kept inside the spec's
   bounds where the spec sets them (learning tightens a data set's bounds to what its history
   shows, never loosens them past what its owner wrote);
3. the **spec**'s `quality.ctr` / `quality.row_count_ratio`.
An end none of them sets is open.

The row-count ratio is a day's rows over the rows *expected* of it: the median of the learned
days on the log scale, moved by the day's weekday level when the history shows a weekly pattern
(`expected_rows`); without enough history, the median of the trailing `history_days` days.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

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
    def from_params(cls, params: Mapping[str, Any] | Any | None) -> GateOverrides:
        """From DAG params or a `TrainRequest` (anything with the knobs as keys or attributes)."""
        if params is None:
            return cls()
        get = params.get if isinstance(params, Mapping) else (lambda k: getattr(params, k, None))
        given = {attr: get(knob) for attr, knob in cls.PARAMS.items()}
        return cls(**{attr: (None if value is None else float(value)) for attr, value in given.items()})


@dataclass(frozen=True)
class Learned:
    """Bounds learned from the history, each with the number of days it came from (None: too few)."""

    ctr: tuple[float, float, int] | None = None
    row_count_ratio: tuple[float, float, int] | None = None


@dataclass(frozen=True)
class ExpectedRows:
    """The rows a day is expected to hold, and how that was worked out (for the check's text)."""

    rows: float
    how: str
    """e.g. `the median of 28 days, Saturdays 0.71x` or `the median of the 7 trailing days`."""
    log_spread: float | None = None
    """The robust spread of the learned days' log rows around their expected level (None: not learned)."""
    days: int = 0


WEEKDAYS = ("Mondays", "Tuesdays", "Wednesdays", "Thursdays", "Fridays", "Saturdays", "Sundays")


def robust_sd(x: np.ndarray) -> float:
    """Rousseeuw and Croux's Qn: the first quartile of the pairwise distances, scaled to a normal
    standard deviation. As robust as the MAD (half the values may be wild) but about twice as
    precise on a month of days, where a MAD that happens to be small makes bounds too tight."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if n < 2:
        return 0.0
    i, j = np.triu_indices(n, k=1)
    dist = np.sort(np.abs(x[i] - x[j]))
    h = n // 2 + 1
    k = h * (h - 1) // 2
    small = n / (n + 1.4) if n % 2 else n / (n + 3.8)  # Croux and Rousseeuw's finite-sample factor
    return 2.2219 * small * float(dist[min(k, len(dist)) - 1])


def expected_rows(quality: QualitySpec, config: GateConfig, day_counts: Mapping[date, int], day: date) -> ExpectedRows | None:
    """The rows `day` is expected to hold, from the days before it (days without data are not
    days of the history: preprocessing skips them). None without any day before it.

    With `learn_from_days` of history (at least `learn_min_days` days): the median of the days' log
    rows, moved to the checked day's weekday level when there are three weeks of history and the
    weekday levels take away a fifth of the spread; the spread is the robust standard deviation
    (`robust_sd`) of each day's distance from that prediction, made without the day itself. Otherwise the median of the trailing
    `history_days` days with data."""
    n = quality.learn_from_days
    learned = sorted((d, c) for d, c in day_counts.items() if day - timedelta(days=n) <= d < day and c > 0) if n > 0 else []
    if len(learned) >= config.learn_min_days:
        logs = np.log(np.array([c for _, c in learned], dtype=np.float64))
        center = float(np.median(logs))
        resid = logs - center
        weekdays = np.array([d.weekday() for d, _ in learned])
        spread, level = robust_sd(resid), 0.0
        if all((weekdays == w).sum() >= 3 for w in range(7)):
            # each day against the median of the *other* days of its weekday: the error of
            # predicting a day this way (a level fitted on the day itself would hide its spread)
            loo = np.array([r - float(np.median(resid[(weekdays == w) & (np.arange(len(resid)) != i)]))
                            for i, (r, w) in enumerate(zip(resid, weekdays))])
            # a weekly pattern only when it explains the spread, not when medians fit noise
            if robust_sd(loo) < 0.8 * spread:
                spread = robust_sd(loo)
                level = float(np.median(resid[weekdays == day.weekday()]))
        how = f"the median of {len(learned)} days" + (f", {WEEKDAYS[day.weekday()]} {np.exp(level):.2f}x" if level else "")
        return ExpectedRows(float(np.exp(center + level)), how, spread, len(learned))
    trailing = [c for d, c in day_counts.items() if day - timedelta(days=quality.history_days) <= d < day and c > 0]
    if not trailing:
        return None
    how = f"the median of the {len(trailing)} trailing days with data"
    return ExpectedRows(float(np.median(trailing)), how, None, len(trailing))


def learn_width(k: float, spread: float, days: int, config: GateConfig) -> float:
    """How far (log scale) a learned bound lies from its center: `k` spreads, more while few days
    are known (a spread of 7 values is itself uncertain), at least `learn_margin`."""
    return max(k * (1 + 3 / max(days, 1)) * spread, float(np.log1p(config.learn_margin)))


def _ctr_bounds(ctrs: list[tuple[float, int]], rows: int, config: GateConfig) -> tuple[float, float, int] | None:
    """center ± learn_k * sqrt(day-to-day variance + the checked day's sampling variance): the
    center is the median label rate, the day-to-day variance what the robust spread of the daily rates shows
    beyond their own sampling noise. Half-width at least `learn_margin` of the center."""
    if len(ctrs) < config.learn_min_days:
        return None
    rate = np.array([c for c, _ in ctrs])
    n = np.array([max(k, 1) for _, k in ctrs], dtype=np.float64)
    center = float(np.median(rate))
    sampling = center * (1 - center)
    between = max(0.0, robust_sd(rate) ** 2 - float(np.median(sampling / n)))
    half = config.learn_k * (1 + 3 / len(ctrs)) * float(np.sqrt(between + sampling / max(rows, 1)))
    half = max(half, config.learn_margin * center)
    return max(center - half, 0.0), min(center + half, 1.0), len(ctrs)


def learn_bounds(
    quality: QualitySpec, config: GateConfig, day_counts: Mapping[date, int], day_ctrs: Mapping[date, float],
    before: date, rows: int = 0,
) -> Learned:
    """Bounds learned from the `quality.learn_from_days` days before `before`: `day_counts` are
    rows per day (days without data absent), `day_ctrs` the label rate per day (stored profiles),
    `rows` the checked day's rows (a small day's label rate gets a wider interval).

    Rows: `expected_rows`, and the ratio may go `learn_k_rows` robust spreads of the history's log
    rows below and above it (at least `learn_margin`). Label rate: `_ctr_bounds`."""
    n = quality.learn_from_days
    if n <= 0:
        return Learned()
    first = before - timedelta(days=n)
    ctrs = [(c, int(day_counts.get(d, 0))) for d, c in day_ctrs.items() if first <= d < before and c == c]
    ratio = None
    exp = expected_rows(quality, config, day_counts, before)
    if exp is not None and exp.log_spread is not None:
        below, above = (learn_width(k, exp.log_spread, exp.days, config) for k in config.learn_k_rows)
        ratio = (float(np.exp(-below)), float(np.exp(above)), exp.days)
    return Learned(ctr=_ctr_bounds(ctrs, rows, config), row_count_ratio=ratio)


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
        row_count_ratio=_bound("row_count_ratio", ((overrides.rows_ratio_min, p["rows_ratio_min"]),
                                                   (overrides.rows_ratio_max, p["rows_ratio_max"])),
                               learned.row_count_ratio, (quality.row_count_ratio_min, quality.row_count_ratio_max)),
    )
