"""Mergeable sketches, written with numpy: distinct counts, quantiles, heavy hitters.

Every sketch here merges so that `merge(sketch(a), sketch(b))` is what sketching `a ∪ b` gives:
exactly for `LogHistogram` and `HyperLogLog` (bucket sums and register maxima), and exactly for
`TopK` while the number of distinct values stays within its capacity (approximate beyond).
All of them serialise to small JSON-able dicts.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SMALL_BATCH = 20_000


class HyperLogLog:
    """Flajolet et al.'s HyperLogLog over 64-bit hashes: 2**p one-byte registers.

    The relative standard error is about 1.04 / sqrt(2**p) (1.6 % at p=12); small counts use
    linear counting, which is close to exact while most registers are empty.
    """

    def __init__(self, p: int = 12, registers: np.ndarray | None = None) -> None:
        if not 4 <= p <= 16:
            raise ValueError(f"HyperLogLog precision p must be in [4, 16], got {p}")
        self.p = p
        self.m = 1 << p
        self.registers = np.zeros(self.m, dtype=np.uint8) if registers is None else registers.astype(np.uint8)

    def add_hashes(self, hashes: np.ndarray) -> None:
        if len(hashes) == 0:
            return
        idx, rank = self.slots(hashes)
        if len(idx) < SMALL_BATCH:
            # a trainer's poll batch: scatter-max beats touching all m * 64 bins
            np.maximum.at(self.registers, idx, rank.astype(np.uint8))
            return
        seen = np.bincount(idx * 64 + rank, minlength=self.m * 64).reshape(self.m, 64) > 0
        batch_max = np.where(seen, np.arange(64), 0).max(axis=1).astype(np.uint8)
        np.maximum(self.registers, batch_max, out=self.registers)

    def slots(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(register index, rank) of each hash: `add_hashes` keeps the highest rank per register."""
        h = np.asarray(hashes, dtype=np.uint64)
        idx = (h >> np.uint64(64 - self.p)).astype(np.int64)
        rest = h << np.uint64(self.p)
        # rank = leading zeros of the remaining bits + 1. frexp gives the bit length exactly except
        # within 2**-53 of a power of two, which costs nothing measurable in the estimate.
        _, bit_length = np.frexp(rest.astype(np.float64))
        max_rank = 64 - self.p + 1
        rank = np.clip(65 - bit_length, 1, max_rank).astype(np.int64)
        rank[rest == 0] = max_rank
        return idx, rank

    def merge(self, other: HyperLogLog) -> HyperLogLog:
        if other.p != self.p:
            raise ValueError(f"cannot merge HyperLogLog sketches of precision {self.p} and {other.p}")
        return HyperLogLog(self.p, np.maximum(self.registers, other.registers))

    def estimate(self) -> float:
        m = self.m
        alpha = 0.7213 / (1 + 1.079 / m)
        raw = alpha * m * m / float(np.sum(np.ldexp(1.0, -self.registers.astype(np.int64))))
        zeros = int(np.count_nonzero(self.registers == 0))
        if raw <= 2.5 * m and zeros:
            return m * math.log(m / zeros)
        return raw

    def to_dict(self) -> dict[str, Any]:
        return {"p": self.p, "registers": base64.b64encode(self.registers.tobytes()).decode("ascii")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HyperLogLog:
        regs = np.frombuffer(base64.b64decode(d["registers"]), dtype=np.uint8).copy()
        return cls(int(d["p"]), regs)


CELL_BITS = 11
"""`LogHistogram.add_float32` counts float32 values per 2**CELL_BITS consecutive bit patterns."""
ZERO_BUCKET = np.iinfo(np.int64).min
"""`LogHistogram._buckets_of` for values counted as zero."""


class LogHistogram:
    """A quantile sketch with relative accuracy `alpha` (the DDSketch construction).

    A value x > 0 falls in bucket ceil(log_gamma(x)) with gamma = (1 + alpha) / (1 - alpha), so
    every quantile is returned within a factor (1 ± alpha) of a true value of that rank; negative
    values mirror this, and |x| below `min_value` counts as zero. Buckets add up on merge, so a
    merged sketch equals the sketch of the union exactly.
    """

    def __init__(self, alpha: float = 0.01, min_value: float = 1e-9) -> None:
        if not 0 < alpha < 1:
            raise ValueError(f"LogHistogram alpha must be in (0, 1), got {alpha}")
        self.alpha = alpha
        self.min_value = min_value
        self.gamma = (1 + alpha) / (1 - alpha)
        self._inv_log_gamma = 1.0 / math.log(self.gamma)
        self.positive: dict[int, int] = {}
        self.negative: dict[int, int] = {}
        self.zero = 0

    @property
    def count(self) -> int:
        return self.zero + sum(self.positive.values()) + sum(self.negative.values())

    def _add_side(self, store: dict[int, int], magnitudes: np.ndarray) -> None:
        if len(magnitudes) == 0:
            return
        keys = self._keys(magnitudes)
        lo = int(keys.min())
        counts = np.bincount(keys - lo)
        for k in np.flatnonzero(counts):
            key = int(k) + lo
            store[key] = store.get(key, 0) + int(counts[k])

    def add(self, values: np.ndarray) -> None:
        """Add finite values (the caller drops nulls and NaN, which it counts separately)."""
        x = np.asarray(values, dtype=np.float64)
        if len(x) and x.min() >= 0:  # the usual case (features are scaled to [0, 1]): fewer passes
            pos = x >= self.min_value
            self.zero += len(x) - int(np.count_nonzero(pos))
            self._add_side(self.positive, x[pos])
            return
        mag = np.abs(x)
        small = mag < self.min_value
        self.zero += int(np.count_nonzero(small))
        self._add_side(self.positive, x[(x > 0) & ~small])
        self._add_side(self.negative, -x[(x < 0) & ~small])

    def _keys(self, magnitudes: np.ndarray) -> np.ndarray:
        """Bucket index of each magnitude (>= min_value): the formula `_add_side` applies."""
        return np.ceil(np.log(np.asarray(magnitudes, dtype=np.float64)) * self._inv_log_gamma).astype(np.int64)

    def _buckets_of(self, values: np.ndarray) -> np.ndarray:
        """Bucket index of each non-negative value as `add` files it, or `ZERO_BUCKET` for the
        values `add` counts as zero."""
        keys = self._keys(np.maximum(values, self.min_value))
        return np.where(values >= self.min_value, keys, ZERO_BUCKET)

    def add_counted(self, values: np.ndarray, counts: np.ndarray) -> None:
        """`add` of each value repeated `counts` times: the same buckets, from one logarithm per
        distinct value."""
        v = np.asarray(values, dtype=np.float64)
        c = np.asarray(counts, dtype=np.int64)
        mag = np.abs(v)
        small = mag < self.min_value
        self.zero += int(c[small].sum())
        for store, side in ((self.positive, (v > 0) & ~small), (self.negative, (v < 0) & ~small)):
            if not side.any():
                continue
            keys = self._keys(mag[side])
            lo = int(keys.min())
            # float weights are exact: every partial sum is a count of rows, far below 2**53
            sums = np.bincount(keys - lo, weights=c[side])
            for k in np.flatnonzero(sums):
                key = int(k) + lo
                store[key] = store.get(key, 0) + int(sums[k])

    def add_float32(self, values: np.ndarray | Sequence[np.ndarray]) -> None:
        """`add` for finite float32 values (an array, or the chunks of a column), without a
        logarithm per value: the same buckets.

        The values are counted per cell of 2**CELL_BITS consecutive float32s (the bit pattern
        shifted right: a relative width of 2**-12, about 1/80 of a bucket), one bincount per
        chunk. The bucket index ceil(log(x) / log(gamma)) never decreases as a float32 x grows:
        neighbouring float32s differ in log(x) by about 2**-24 or more, and a float64 log errs by
        a few ulps (under 1e-13), so rounding cannot reverse their order. A cell whose first and
        last float32 fall in the same bucket therefore has all its values there; the few values
        in cells that straddle a bucket boundary (or `min_value`) take the per-value path. Values
        with a sign bit (negatives, -0.0) take the per-value path too.
        """
        chunks = [np.ascontiguousarray(values)] if isinstance(values, np.ndarray) else [np.ascontiguousarray(c) for c in values]
        chunks = [c for c in chunks if len(c)]
        if any(c.dtype != np.float32 for c in chunks):
            raise ValueError(f"add_float32 takes float32 values, got {[str(c.dtype) for c in chunks]}; use add()")
        if not chunks:
            return
        bits = [c.view(np.int32) for c in chunks]
        if min(int(b.min()) for b in bits) < 0:
            self.add(np.concatenate(chunks))
            return
        # the bit patterns of non-negative float32s order like their values
        base = min(int(b.min()) for b in bits) >> CELL_BITS
        size = (max(int(b.max()) for b in bits) >> CELL_BITS) - base + 1
        counts = np.zeros(size, dtype=np.int64)
        # a chunk at a time (its cells stay in cache), the cell numbers computed straight into
        # one reused intp buffer: bincount takes intp without a converted copy (3x faster than
        # `np.bincount((b >> CELL_BITS) - base)` on 5M values)
        buf = np.empty(max(len(b) for b in bits), dtype=np.intp)

        def cells_of(b: np.ndarray) -> np.ndarray:
            x = buf[: len(b)]
            np.right_shift(b, CELL_BITS, out=x)
            x -= base
            return x

        for b in bits:
            counts += np.bincount(cells_of(b), minlength=size)
        occupied = np.flatnonzero(counts)
        start = ((occupied + base) << CELL_BITS).astype(np.int32)
        first = start.view(np.float32).astype(np.float64)
        last = (start | ((1 << CELL_BITS) - 1)).view(np.float32).astype(np.float64)
        whole = self._buckets_of(first) == self._buckets_of(last)
        self.add_counted(first[whole], counts[occupied[whole]])
        if not whole.all():
            straddles = np.zeros(size, dtype=bool)
            straddles[occupied[~whole]] = True
            self.add(np.concatenate([c[straddles[cells_of(b)]] for c, b in zip(chunks, bits)]))

    def merge(self, other: LogHistogram) -> LogHistogram:
        if other.alpha != self.alpha or other.min_value != self.min_value:
            raise ValueError("cannot merge LogHistograms with different alpha/min_value")
        out = LogHistogram(self.alpha, self.min_value)
        out.zero = self.zero + other.zero
        for mine, theirs, dest in ((self.positive, other.positive, out.positive), (self.negative, other.negative, out.negative)):
            dest.update(mine)
            for k, c in theirs.items():
                dest[k] = dest.get(k, 0) + c
        return out

    def buckets(self) -> tuple[np.ndarray, np.ndarray]:
        """(representative value, count) of every non-empty bucket, in increasing value order."""
        def rep(keys: np.ndarray) -> np.ndarray:
            return 2.0 * np.power(self.gamma, keys.astype(np.float64)) / (self.gamma + 1.0)

        neg_k = np.array(sorted(self.negative, reverse=True), dtype=np.int64)
        pos_k = np.array(sorted(self.positive), dtype=np.int64)
        values = np.concatenate([-rep(neg_k), [0.0] if self.zero else [], rep(pos_k)])
        counts = np.concatenate(
            [
                np.array([self.negative[int(k)] for k in neg_k], dtype=np.int64),
                np.array([self.zero] if self.zero else [], dtype=np.int64),
                np.array([self.positive[int(k)] for k in pos_k], dtype=np.int64),
            ]
        )
        return values, counts

    def quantiles(self, qs: np.ndarray | list[float]) -> np.ndarray:
        values, counts = self.buckets()
        if len(values) == 0:
            return np.full(len(qs), np.nan)
        cum = np.cumsum(counts)
        ranks = np.asarray(qs, dtype=np.float64) * (cum[-1] - 1)
        picked: np.ndarray = values[np.searchsorted(cum, ranks, side="right").clip(0, len(values) - 1)]
        return picked

    def to_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "min_value": self.min_value,
            "zero": self.zero,
            "positive": sorted([k, c] for k, c in self.positive.items()),
            "negative": sorted([k, c] for k, c in self.negative.items()),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LogHistogram:
        out = cls(float(d["alpha"]), float(d["min_value"]))
        out.zero = int(d["zero"])
        out.positive = {int(k): int(c) for k, c in d["positive"]}
        out.negative = {int(k): int(c) for k, c in d["negative"]}
        return out


@dataclass
class TopK:
    """Counts of the most frequent values, plus the total of the rest (`other`).

    Exact while the number of distinct values stays within `capacity`; past it, the least
    frequent are folded into `other` (a value's count may then be an underestimate).
    """

    capacity: int = 256
    counts: dict[Any, int] = field(default_factory=dict)
    other: int = 0

    def add_counts(self, values: list[Any], counts: list[int]) -> None:
        for v, c in zip(values, counts):
            self.counts[v] = self.counts.get(v, 0) + int(c)
        self._prune()

    def _prune(self) -> None:
        if len(self.counts) <= self.capacity:
            return
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], str(kv[0])))
        self.other += sum(c for _, c in ranked[self.capacity :])
        self.counts = dict(ranked[: self.capacity])

    @property
    def exact(self) -> bool:
        return self.other == 0

    def top(self, k: int) -> list[tuple[Any, int]]:
        return sorted(self.counts.items(), key=lambda kv: (-kv[1], str(kv[0])))[:k]

    def merge(self, other: TopK) -> TopK:
        out = TopK(max(self.capacity, other.capacity), dict(self.counts), self.other + other.other)
        out.add_counts(list(other.counts), list(other.counts.values()))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "other": self.other, "counts": [[k, c] for k, c in self.top(len(self.counts))]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TopK:
        return cls(int(d["capacity"]), {k: int(c) for k, c in d["counts"]}, int(d["other"]))
