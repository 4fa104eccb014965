"""One feature's distribution as counts over fixed bins, from profiles only.

Two profiles can only be compared over the same bins, and a null distribution can only be drawn
over bins: numbers are binned at the reference's deciles (deduplicated, so a feature with few
distinct values gets fewer bins), list and sequence lengths the same way, and categories as the
reference's most frequent values plus one bin for the rest. Each bin's count is exact for numbers
(the quantile sketch's buckets fall wholly on one side of an edge) and lengths, and for categories
while the compared profile's top-k is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from slipstream.quality.profiles import ColumnProfile

DECILE_BINS = 10
TOP_CATEGORIES = 50
"""Categories with a bin of their own; the rest share one. Enough to see a value's share move,
few enough that a day of a few hundred rows still fills the bins."""
MIN_CATEGORY_SHARE = 0.002
"""A category rarer than this in the reference goes to the shared bin."""


@dataclass(frozen=True)
class Bins:
    """How one feature is binned: `edges` for numbers and lengths, `keys` for categories."""

    feature: str
    kind: str
    """The column profile's kind: numeric, categorical or sequence."""
    edges: np.ndarray | None = None
    keys: tuple[Any, ...] = ()

    @property
    def method(self) -> str:
        """The distance the feature is scored with: `psi` for numbers, `js` for categories and lengths."""
        return "psi" if self.kind == "numeric" else "js"

    @property
    def size(self) -> int:
        return len(self.keys) + 1 if self.edges is None else len(self.edges) + 1

    def counts(self, col: ColumnProfile | None) -> np.ndarray:
        """Rows of `col` in each bin (non-null, finite values); zeros for a missing column."""
        out = np.zeros(self.size, dtype=np.int64)
        if col is None or col.kind != self.kind:
            return out
        if self.edges is not None:
            values, counts = _value_counts(col)
            if counts.sum() == 0:
                return out
            cum = np.concatenate([[0], np.cumsum(counts)])
            at = cum[np.searchsorted(values, self.edges, side="right")]
            return np.diff(np.concatenate([[0], at, [cum[-1]]])).astype(np.int64)
        assert col.topk is not None
        total = sum(col.topk.counts.values()) + col.topk.other
        for i, k in enumerate(self.keys):
            out[i] = col.topk.counts.get(k, 0)
        out[-1] = total - int(out[:-1].sum())
        return out


def _value_counts(col: ColumnProfile) -> tuple[np.ndarray, np.ndarray]:
    if col.kind == "sequence":
        keys = np.array(sorted(col.lengths), dtype=np.float64)
        return keys, np.array([col.lengths[int(k)] for k in keys], dtype=np.int64)
    if col.hist is None:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    return col.hist.buckets()


def _pooled_values(cols: Sequence[ColumnProfile]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values (bucket representatives, lengths) of several profiles and their summed
    counts: what a merged profile would give, without merging the rest of each profile."""
    parts = [_value_counts(c) for c in cols]
    values = np.concatenate([v for v, _ in parts]) if parts else np.zeros(0)
    counts = np.concatenate([c for _, c in parts]) if parts else np.zeros(0, dtype=np.int64)
    if len(values) == 0:
        return values, counts
    keys, inverse = np.unique(values, return_inverse=True)
    return keys, np.bincount(inverse, weights=counts).astype(np.int64)


def bins_of(feature: str, refs: Sequence[ColumnProfile]) -> Bins | None:
    """The bins of `feature` drawn from its reference profiles taken together (the days of a
    reference); None when it cannot be binned (an id, a time, an empty reference)."""
    cols = [c for c in refs if c is not None]
    kinds = {c.kind for c in cols}
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    if kind in ("numeric", "sequence"):
        values, counts = _pooled_values(cols)
        if counts.sum() == 0:
            return None
        cum = np.cumsum(counts)
        ranks = np.linspace(0, 1, DECILE_BINS + 1)[1:-1] * (cum[-1] - 1)
        edges = np.unique(values[np.searchsorted(cum, ranks, side="right").clip(0, len(values) - 1)])
        # the last value as an edge would make an always-empty top bin
        edges = edges[edges < values[-1]]
        return Bins(feature, kind, edges=edges)
    if kind == "categorical":
        totals: dict[Any, int] = {}
        other = 0
        for c in cols:
            if c.topk is None:
                return None
            other += c.topk.other
            for k, n in c.topk.counts.items():
                totals[k] = totals.get(k, 0) + n
        total = sum(totals.values()) + other
        if total == 0:
            return None
        top = sorted(totals.items(), key=lambda kv: (-kv[1], str(kv[0])))[:TOP_CATEGORIES]
        return Bins(feature, kind, keys=tuple(k for k, n in top if n >= MIN_CATEGORY_SHARE * total))
    return None
