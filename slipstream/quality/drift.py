"""Distribution shift between two profiles: PSI for numeric features, Jensen–Shannon for
categorical ones (and sequence lengths), on `FeatureProfile`s only, never on rows.

`compare_profiles` scores every feature against fixed thresholds (PSI 0.2, JS 0.1). Whether a
feature moved *more than it usually moves* (a null distribution at the compared sizes and the
table's own day-to-day movement) is `drift_days` for days and `skew` for batch against stream;
both report their verdicts as `FeatureShift`s whose threshold is the limit they computed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from slipstream.quality.profiles import ColumnProfile, FeatureProfile
from slipstream.quality.sketches import LogHistogram
from slipstream.samples.spec import LABEL, Spec

PSI_BINS = 10
_EPS = 1e-4


@dataclass(frozen=True)
class FeatureShift:
    feature: str
    method: str
    """`psi` or `js`."""
    score: float
    threshold: float
    mean_a: float
    mean_b: float
    null_rate_a: float
    null_rate_b: float
    rows_a: int = 0
    rows_b: int = 0
    expected: float = math.nan
    """What chance alone gives at these sizes (NaN: a fixed threshold, not a null distribution)."""
    baseline_days: int = 0
    """Past days (or batch hours) whose movement made the threshold (0: too few of them to know the
    usual movement: chance and a fixed threshold only)."""

    @property
    def drifted(self) -> bool:
        return self.score > self.threshold

    @property
    def times_limit(self) -> float:
        """How far the score went past what chance expects, as a multiple of the room the threshold
        leaves (> 1: over it); the plain score / threshold without a null distribution."""
        base = self.expected if self.expected == self.expected else 0.0
        room = self.threshold - base
        return (self.score - base) / room if room > 0 and self.score == self.score else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "drifted": self.drifted}


def _cdf_at(hist: LogHistogram, edges: np.ndarray) -> np.ndarray:
    values, counts = hist.buckets()
    if counts.sum() == 0:
        return np.zeros(len(edges))
    cum = np.concatenate([[0], np.cumsum(counts)])
    cdf: np.ndarray = cum[np.searchsorted(values, edges, side="right")] / counts.sum()
    return cdf


def psi(ref: LogHistogram, cur: LogHistogram, bins: int = PSI_BINS) -> float:
    """Population stability index of `cur` against `ref`, over `ref`'s quantile bins.

    sum((p_cur - p_ref) * ln(p_cur / p_ref)); bins are the reference's deciles (deduplicated, so
    a feature with few distinct values gets fewer bins), probabilities floored at 1e-4.
    """
    if ref.count == 0 or cur.count == 0:
        return float("nan")
    edges = np.unique(ref.quantiles(np.linspace(0, 1, bins + 1)[1:-1]))
    # Each bucket's representative value stands for the whole bucket in both sketches, so a
    # value equal to an edge lands on the same side in both.
    p = np.diff(np.concatenate([[0.0], _cdf_at(ref, edges), [1.0]]))
    q = np.diff(np.concatenate([[0.0], _cdf_at(cur, edges), [1.0]]))
    p, q = np.maximum(p, _EPS), np.maximum(q, _EPS)
    return float(np.sum((q - p) * np.log(q / p)))


def js_divergence(a: dict[Any, float], b: dict[Any, float]) -> float:
    """Jensen–Shannon divergence (base 2, in [0, 1]) of two count dictionaries."""
    keys = sorted(set(a) | set(b), key=str)
    p = np.array([float(a.get(k, 0)) for k in keys])
    q = np.array([float(b.get(k, 0)) for k in keys])
    if p.sum() == 0 or q.sum() == 0:
        return float("nan")
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(x: np.ndarray) -> float:
        nz = x > 0
        return float(np.sum(x[nz] * np.log2(x[nz] / m[nz])))

    return max(0.0, 0.5 * kl(p) + 0.5 * kl(q))


def _categories(col: ColumnProfile) -> dict[Any, float]:
    if col.kind == "sequence":
        return {k: float(c) for k, c in col.lengths.items()}
    assert col.topk is not None
    counts: dict[Any, float] = {str(k): float(c) for k, c in col.topk.counts.items()}
    if col.topk.other:
        counts["__other__"] = float(col.topk.other)
    return counts


def feature_shift(
    name: str, ref: ColumnProfile, cur: ColumnProfile, psi_threshold: float, js_threshold: float
) -> FeatureShift:
    if ref.kind in ("categorical", "sequence"):
        method, score, limit = "js", js_divergence(_categories(ref), _categories(cur)), js_threshold
    else:
        assert ref.hist is not None and cur.hist is not None
        method, score, limit = "psi", psi(ref.hist, cur.hist), psi_threshold
    def mean(c: ColumnProfile) -> float:
        return c.mean if c.kind in ("numeric", "sequence") and c.count else math.nan

    return FeatureShift(name, method, score, limit, mean(ref), mean(cur), ref.null_fraction, cur.null_fraction)


def drift_features(spec: Spec) -> tuple[str, ...]:
    """The columns whose distribution is compared, in spec order: dense numbers (PSI),
    categoricals, lists and sequences (Jensen–Shannon of values / lengths), then the label. Ids
    are left out: a sketch of distinct ids says nothing about their mix."""
    return (*(f.name for f in spec.features if f.kind != "id"), LABEL)


def compare_profiles(
    ref: FeatureProfile, cur: FeatureProfile, spec: Spec, *, psi_threshold: float = 0.2, js_threshold: float = 0.1
) -> list[FeatureShift]:
    """Shift of every feature of `spec` present in both profiles (reference first)."""
    out = []
    for name in drift_features(spec):
        if name in ref.columns and name in cur.columns and ref.columns[name].kind == cur.columns[name].kind:
            out.append(feature_shift(name, ref.columns[name], cur.columns[name], psi_threshold, js_threshold))
    return out
