"""Whether a feature moved more than it usually moves: a distance with a null distribution.

A distance between two samples of the same distribution is never zero: PSI and Jensen–Shannon
of a day of 300 rows against a week of history are large by chance alone, and a log whose days
each come from a different handful of heavy users moves every day for real, without a fault.
A fixed threshold on the distance therefore alarms on small days and on bursty data, and stays
silent on large, steady data that moved a little. Here a feature alarms only when its distance
is beyond both:

1. **chance at this size**: the distance between two samples drawn, with the compared sizes,
   from one distribution (the pooled counts), `bootstrap` times: the null mean and its
   `quantile`. Small days get a wide interval, not an alarm;
2. **its usual movement**: the same table's own day-to-day movement of that feature. Each past
   day's *excess* is its distance above chance at its size; the usual movement is the largest
   excess of the last `baseline_days` days times `usual_factor` (times sqrt(baseline_days / N)
   when only N < baseline_days past days are known: a shorter past has seen fewer of the rare
   large days). Day-to-day movement has heavy tails on real data (a day that is half one user's),
   which a median and a MAD would call extreme; the largest past move does not. With fewer than
   `min_baseline` past days the usual movement is unknown and only a large move alarms
   (`fallback_psi`, `fallback_js`);

and at least an effect-size floor (`floor_psi`, `floor_js`), so a statistically clear but tiny
move on a huge day is not called drift. The limit is `expected + max(chance margin, usual)`.
Measured with `slipstream bench insight` (docs/benchmarks.md#insight): on a generated ratings log
where 5-60 % of each day comes from three users, 2 of 238 feature-days alarm (both while fewer
than 5 past days were known) against 25 with fixed thresholds; every injected drift of the
steady worlds alarms on its first day.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slipstream.errors import ConfigError

PSI_FLOOR_P = 1e-4
"""Bin probabilities are floored at this in PSI (an empty bin would make it infinite)."""


@dataclass(frozen=True, kw_only=True)
class MovementConfig:
    bootstrap: int = 300
    """Draws of the sampling null of a judged comparison (its quantile needs them)."""
    baseline_draws: int = 20
    """Draws of the sampling null of a past day or slice, whose mean alone is used."""
    quantile: float = 0.999
    """The sampling null's quantile a distance must pass."""
    usual_factor: float = 1.5
    """A day's excess must pass this times the largest excess of the past days."""
    min_baseline: int = 5
    """Past days with a distance needed before their movement counts as the usual one."""
    baseline_days: int = 28
    """Past days whose movement makes the usual one."""
    floor_psi: float = 0.05
    floor_js: float = 0.02
    """Effect-size floors: a smaller distance never alarms, however clear."""
    fallback_psi: float = 0.5
    fallback_js: float = 0.25
    """Thresholds used while a feature's usual movement is unknown (too few past days): only a
    distribution that changed a lot alarms."""

    def __post_init__(self) -> None:
        if self.bootstrap < 50:
            raise ConfigError(f"bootstrap must be >= 50 draws, got {self.bootstrap}")
        if not 0.5 < self.quantile < 1:
            raise ConfigError(f"quantile must be in (0.5, 1), got {self.quantile}")
        if self.usual_factor < 1:
            raise ConfigError(f"usual_factor must be >= 1, got {self.usual_factor}")
        if self.min_baseline < 3 or self.baseline_days < self.min_baseline:
            raise ConfigError(f"need 3 <= min_baseline <= baseline_days, got {self.min_baseline} and {self.baseline_days}")

    def floor(self, method: str) -> float:
        return self.floor_psi if method == "psi" else self.floor_js

    def fallback(self, method: str) -> float:
        return self.fallback_psi if method == "psi" else self.fallback_js


def distance(method: str, ref: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """PSI (`psi`) or Jensen–Shannon divergence in bits (`js`) of bin counts `cur` against `ref`,
    over the last axis (so a batch of draws is scored at once); NaN where a side is empty."""
    ref = np.asarray(ref, dtype=np.float64)
    cur = np.asarray(cur, dtype=np.float64)
    rs, cs = ref.sum(-1, keepdims=True), cur.sum(-1, keepdims=True)
    empty = (rs[..., 0] == 0) | (cs[..., 0] == 0)
    p = ref / np.where(rs == 0, 1, rs)
    q = cur / np.where(cs == 0, 1, cs)
    if method == "psi":
        p, q = np.maximum(p, PSI_FLOOR_P), np.maximum(q, PSI_FLOOR_P)
        out = np.sum((q - p) * np.log(q / p), axis=-1)
    elif method == "js":
        m = (p + q) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            kl_p = np.where(p > 0, p * np.log2(p / np.where(m > 0, m, 1)), 0.0).sum(-1)
            kl_q = np.where(q > 0, q * np.log2(q / np.where(m > 0, m, 1)), 0.0).sum(-1)
        out = np.maximum(0.0, 0.5 * kl_p + 0.5 * kl_q)
    else:
        raise ValueError(f"unknown distance {method!r}; expected psi or js")
    return np.where(empty, np.nan, out)


@dataclass(frozen=True)
class Chance:
    """The distance two samples of these sizes from one distribution show by chance."""

    mean: float
    upper: float


def redraw(rng: np.random.Generator, n: int, p: np.ndarray, draws: int) -> np.ndarray:
    """`draws` samples of about `n` rows from bin probabilities `p`: independent Poisson counts,
    which given their total are exactly multinomial, and a distance only sees the proportions
    (one vectorised draw, where numpy's multinomial loops over the draws)."""
    return rng.poisson(n * p, size=(draws, len(p)))


def chance(method: str, ref: np.ndarray, cur: np.ndarray, config: MovementConfig, key: str = "",
           draws: int | None = None) -> Chance:
    """The sampling null of `distance(method, ref, cur)`: both sides drawn again with their own
    sizes from their pooled counts, `draws` times (default `config.bootstrap`). Seeded by `key`
    and the counts: the same comparison always gets the same interval."""
    n_ref, n_cur = int(ref.sum()), int(cur.sum())
    if n_ref == 0 or n_cur == 0:
        return Chance(math.nan, math.nan)
    pooled = (ref + cur).astype(np.float64)
    pooled /= pooled.sum()
    seed = zlib.crc32(f"{key}|{n_ref}|{n_cur}|{method}".encode())
    rng = np.random.default_rng(seed)
    b = draws or config.bootstrap
    scores = distance(method, redraw(rng, n_ref, pooled, b), redraw(rng, n_cur, pooled, b))
    return Chance(float(np.mean(scores)), float(np.quantile(scores, config.quantile)))


@dataclass(frozen=True)
class Usual:
    """How much a feature usually moves beyond chance, from its past days."""

    excess: float
    """The excess a day may show and still be usual (NaN: too few past days to know)."""
    days: int

    @property
    def known(self) -> bool:
        return self.excess == self.excess


def usual_movement(excess: Sequence[float], config: MovementConfig, units: int | None = None) -> Usual:
    """`usual_factor` * sqrt(baseline_days / N) times the largest of the past excess over chance
    (NaN: fewer than `min_baseline` of them). N is the number of independent units they come from:
    the past days, or `units` when several values come from one day (the hours of a day share its
    users, so 168 hours of 7 days are 7 looks at how much a day moves, not 168)."""
    x = np.asarray([e for e in excess if e == e], dtype=np.float64)
    n = min(len(x), units) if units is not None else len(x)
    if n < config.min_baseline:
        return Usual(math.nan, n)
    factor = config.usual_factor * math.sqrt(config.baseline_days / min(n, config.baseline_days))
    return Usual(factor * max(float(x.max()), 0.0), n)


def limit(method: str, null: Chance, usual: Usual, config: MovementConfig) -> float:
    """The largest distance that is neither past chance nor past the usual movement (nor under the
    effect floor): `expected + max(chance margin, usual excess)`, or the fixed fallback threshold
    while the usual movement is unknown. NaN when a side is empty."""
    if null.mean != null.mean:
        return math.nan
    if usual.excess == usual.excess:
        out = null.mean + max(null.upper - null.mean, usual.excess)
    else:
        out = max(null.upper, config.fallback(method))
    return max(out, config.floor(method))
