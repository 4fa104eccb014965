"""Vectorised per-column kernels of the profile: each gives exactly what its plain Arrow
counterpart gives (`pc.value_counts`, `pc.unique`, `pc.min_max`), at a fraction of the cost
on a day of rows. `tests/unit/test_quality_exactness.py` checks them against it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


SLOT_BITS = 14
"""`value_counts` counts integers in a table of 2**SLOT_BITS slots (256 KB: it stays in cache)."""
_SLOT_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


def numpy_chunks(x: pa.Array | pa.ChunkedArray) -> list[np.ndarray]:
    """The non-empty chunks of a column without nulls, as numpy (zero-copy where Arrow can):
    the kernels below work chunk by chunk instead of on a concatenated copy."""
    chunks = x.chunks if isinstance(x, pa.ChunkedArray) else [x]
    return [c.to_numpy() for c in chunks if len(c)]


def value_counts(x: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """(distinct values, their counts) of a column without nulls, in any order.

    Integers (the categorical columns, a few to a few thousand distinct 60-bit hashes) are
    counted chunk by chunk in a small table: each value goes to a slot (Fibonacci hashing), the
    first value to reach a slot owns it, and one bincount per chunk counts the rows per slot.
    Rows whose value is not their slot's owner are set aside and counted exactly by `np.unique`
    at the end, so slot collisions cost time, never exactness. On 5M rows this is ~20 ms; numpy's
    sort (`np.unique`) takes 60-100 ms and Arrow's hash table 25-70 ms."""
    if not (pa.types.is_integer(x.type) and len(x)):
        vc = pc.value_counts(x)
        return vc.field("values"), vc.field("counts").to_numpy()
    size = 1 << SLOT_BITS
    owner = np.zeros(size, dtype=np.int64)
    claimed = np.zeros(size, dtype=bool)
    counts = np.zeros(size, dtype=np.int64)
    strays: list[np.ndarray] = []
    for chunk in numpy_chunks(x):
        v = chunk.astype(np.int64, copy=False)
        with np.errstate(over="ignore"):
            slot = ((v.view(np.uint64) * _SLOT_MULTIPLIER) >> np.uint64(64 - SLOT_BITS)).astype(np.intp)
        free = ~claimed[slot]
        if free.any():
            # one of the rows of each free slot claims it (whichever the scatter keeps)
            owner[slot[free]] = v[free]
            claimed[slot[free]] = True
        counts += np.bincount(slot, minlength=size)
        stray = owner[slot] != v
        if stray.any():
            strays.append(v[stray])
            counts -= np.bincount(slot[stray], minlength=size)
    held = np.flatnonzero(counts)
    values, tallies = owner[held], counts[held]
    if strays:
        # a stray never equals its slot's owner, and equal values share a slot: no overlap
        more, more_counts = np.unique(np.concatenate(strays), return_counts=True)
        values, tallies = np.concatenate([values, more]), np.concatenate([tallies, more_counts])
    return pa.array(values.astype(x.type.to_pandas_dtype(), copy=False), x.type), tallies


def small_int_counts(x: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray] | None:
    """(ascending distinct values as int64, their counts) of an integer column of at most 32
    bits without nulls, when its range is at most a few times its length (labels, flags): one
    bincount per chunk. None for other columns (wider types, sparse ranges)."""
    if not (pa.types.is_integer(x.type) and x.type.bit_width <= 32 and len(x)):
        return None
    chunks = numpy_chunks(x)
    lo, hi = min(int(c.min()) for c in chunks), max(int(c.max()) for c in chunks)
    if hi - lo > max(4 * len(x), 1 << 16):
        return None
    counts = np.zeros(hi - lo + 1, dtype=np.int64)
    for c in chunks:
        counts += np.bincount(c - lo if lo else c, minlength=len(counts))
    keys = np.flatnonzero(counts)
    return keys + lo, counts[keys]


def distinct_values(x: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The distinct values of `x` (a column without nulls), in any order. Dense non-negative
    integers (ids below 8x the row count) are marked in a bitmap, one store per row, chunk by
    chunk (no concatenated copy); anything else goes to Arrow's hash table, which costs several
    times more per row."""
    if pa.types.is_integer(x.type) and len(x):
        chunks = numpy_chunks(x)
        lo, hi = min(int(c.min()) for c in chunks), max(int(c.max()) for c in chunks)
        if lo >= 0 and hi < 8 * len(x):
            seen = np.zeros(hi + 1, dtype=bool)
            for c in chunks:
                seen[c] = True
            return pa.array(np.flatnonzero(seen).astype(chunks[0].dtype, copy=False))
    return pc.unique(x)


def float_min_max(x: pa.Array | pa.ChunkedArray, chunks: list[np.ndarray]) -> tuple[float, float]:
    """(min, max) of finite float values, as `pc.min_max(x)` gives them; `chunks` are the
    non-empty chunks of `x` as numpy. Only the sign of a zero can differ between the two: when
    the min or max is zero, Arrow's answer (which depends on the order of 0.0 and -0.0 in the
    rows) is taken."""
    lo, hi = min(float(c.min()) for c in chunks), max(float(c.max()) for c in chunks)
    if lo == 0 or hi == 0:
        mm = pc.min_max(x).as_py()
        return float(mm["min"]), float(mm["max"])
    return lo, hi
