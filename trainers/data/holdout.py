"""`slipstream.samples.schema.is_holdout` computed straight from an Arrow string column's buffers.

`is_holdout` takes any sequence and converts it through Python string objects; on the loader's
hot path that costs more than reading the row group. This computes the same FNV-1a hash over
the Arrow data buffer: with the native kernel (`slipstream.samples.native`, one pass over the bytes) where
it is built, else with numpy (tests check all three agree on every id).

The numpy path runs one pass per byte position. Ids of one length stored next to each other (a
row group of counters or UUIDs holds a few such runs) are a 2-d byte matrix over the Arrow buffer,
so a pass reads one column of it with no gather, and the leading columns every id of the run
shares (`imp-0001-`) are hashed once, as a scalar. Arrays of many short runs (lengths that vary
from row to row) are hashed longest first instead: the rows that have a byte at position j are then
a prefix of that order, and the bytes all ids start with (the common prefix of the smallest and the
largest id) are hashed once. Each chunk of a chunked column (a row group) gets its own.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.samples import native
from slipstream.samples.schema import HOLDOUT_MODULO

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def holdout_mask(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """True where fnv1a64(sample_id) % HOLDOUT_MODULO == 0, like schema.is_holdout."""
    if isinstance(ids, pa.ChunkedArray):
        parts = [_holdout_mask(c) for c in ids.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)
    return _holdout_mask(ids)


def _common_prefix(ids: pa.Array) -> bytes:
    bounds = pc.min_max(ids)
    lo, hi = (bounds["min"].as_py() or "").encode(), (bounds["max"].as_py() or "").encode()
    k = 0
    while k < min(len(lo), len(hi)) and lo[k] == hi[k]:
        k += 1
    return lo[:k]


_MAX_RUNS = 16
_MIN_MEAN_RUN = 1024
"""Ids in more runs than _MAX_RUNS that are shorter than this on average are hashed longest first
(a run costs a few numpy calls per byte position)."""


def _holdout_mask(ids: pa.Array) -> np.ndarray:
    if pa.types.is_large_string(ids.type):
        ids = ids.cast(pa.string())
    n = len(ids)
    if n == 0:
        return np.zeros(0, dtype=bool)
    if ids.null_count:
        ids = ids.fill_null("")
    bufs = ids.buffers()
    kern = native.kernels()
    if kern is not None:
        out = np.empty(n, dtype=np.uint8)
        # an Arrow-valid array: offsets ascend within the data buffer (no data buffer: all empty)
        kern.fnv1a_divisible(n, bufs[1].address + 4 * ids.offset, bufs[2].address if bufs[2] is not None else 0,
                             HOLDOUT_MODULO, out.ctypes.data)
        return out.view(np.bool_)
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=ids.offset + n + 1)[ids.offset :].astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(bufs[2], dtype=np.uint8)[first:last] if bufs[2] is not None else np.zeros(0, dtype=np.uint8)
    lengths = np.diff(offsets)
    starts = np.flatnonzero(lengths[1:] != lengths[:-1]) + 1  # where a run of equal lengths starts
    if len(starts) < max(_MAX_RUNS, n // _MIN_MEAN_RUN):
        h = _hash_runs(data, offsets - first, lengths, np.concatenate(([0], starts, [n])))
    else:
        h = _hash_longest_first(ids, data, offsets, lengths)
    held: np.ndarray = h % np.uint64(HOLDOUT_MODULO) == 0
    return held


def _hash_runs(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """FNV-1a of every id, one run of equal-length ids (rows bounds[k]:bounds[k + 1]) at a time."""
    h = np.empty(len(lengths), dtype=np.uint64)
    # schema.id_hash skips NUL bytes (its padding): multiply by 1 where the byte is NUL
    factor = np.where(np.arange(256) == 0, np.uint64(1), _FNV_PRIME) if not data.all() else None
    with np.errstate(over="ignore"):
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            width = int(lengths[a])
            rows = data[offsets[a] : offsets[b]].reshape(b - a, width)
            j, shared = 0, _FNV_OFFSET
            while j < width and rows[0, j] == rows[-1, j] and (rows[:, j] == rows[0, j]).all():
                shared = _fnv1a(bytes(rows[:1, j]), shared)  # a column every id of the run shares
                j += 1
            hk = h[a:b]
            hk[:] = shared
            for col in rows.T[j:]:
                np.bitwise_xor(hk, col, out=hk)
                np.multiply(hk, _FNV_PRIME if factor is None else factor[col], out=hk)
    return h


def _hash_longest_first(ids: pa.Array, data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    n = len(lengths)
    prefix = _common_prefix(ids)
    skip = len(prefix)
    first = int(offsets[0])
    lengths = lengths - skip
    # rows longest first: the rows that have a byte at position j are then a prefix of this order,
    # so every step is a plain gather, xor and multiply over that prefix (no masks)
    counts = np.bincount(lengths)
    order = np.concatenate([np.flatnonzero(lengths == k) for k in np.flatnonzero(counts)[::-1]])
    longer_than = n - np.cumsum(counts)  # rows with more than j bytes
    pos = offsets[:-1][order] - first + skip  # position of byte skip + j of every row
    h = np.full(n, _fnv1a(prefix), dtype=np.uint64)
    # schema.id_hash skips NUL bytes (its padding): multiply by 1 where the byte is NUL
    factor = np.where(np.arange(256) == 0, np.uint64(1), _FNV_PRIME) if (data == 0).any() else None
    with np.errstate(over="ignore"):
        for j in range(len(counts) - 1):
            k = int(longer_than[j])
            byte, hk = data[pos[:k]], h[:k]
            np.bitwise_xor(hk, byte, out=hk)
            np.multiply(hk, _FNV_PRIME if factor is None else factor[byte], out=hk)
            pos[:k] += 1
    out = np.empty(n, dtype=np.uint64)
    out[order] = h
    return out


def _fnv1a(data: bytes, start: np.uint64 = _FNV_OFFSET) -> np.uint64:
    """FNV-1a of the bytes continued from `start`, NUL bytes skipped (as schema.id_hash does)."""
    h = int(start)
    for b in data:
        if b:
            h = ((h ^ b) * int(_FNV_PRIME)) & 0xFFFFFFFFFFFFFFFF
    return np.uint64(h)
