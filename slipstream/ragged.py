"""Gathers of variable-length ranges (a history list per row, a field inside each record).

numpy can only gather ragged ranges value by value (an index per value); Arrow's binary `take`
copies each range as one block. So each range is handed to Arrow as one binary value over the
numpy buffer (zero-copy), and the gathered bytes come back as a numpy array (zero-copy).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _take_blobs(values: np.ndarray, bounds: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of blobs `idx`, blob k being values[bounds[k]:bounds[k + 1]]."""
    if len(idx) == 0:
        return np.empty(0, dtype=values.dtype), np.zeros(1, dtype=np.int64)
    values = np.ascontiguousarray(values)
    size = values.itemsize
    blobs = pa.Array.from_buffers(pa.large_binary(), len(bounds) - 1,
                                  [None, pa.py_buffer(bounds.astype(np.int64) * size), pa.py_buffer(values)])
    taken = blobs.take(pa.array(idx, pa.int64()))
    _, offs_buf, data_buf = taken.buffers()
    offsets = np.frombuffer(offs_buf, dtype=np.int64, count=len(idx) + 1) // size
    if data_buf is None or offsets[-1] == 0:
        return np.empty(0, dtype=values.dtype), offsets
    return np.frombuffer(data_buf, dtype=values.dtype, count=int(offsets[-1])), offsets


def take_lists(values: np.ndarray, offsets: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of the lists at `idx` of a flat values + offsets list column (offsets has
    one entry more than there are lists). The values may be read-only (an Arrow buffer)."""
    return _take_blobs(values, offsets, idx)


def take_ranges(values: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of the ranges values[starts[i]:stops[i]] concatenated, for ranges in
    order and not overlapping (starts[i] <= stops[i] <= starts[i + 1]), e.g. one field of every
    record of a joined buffer. The gaps between them become blobs that are not taken."""
    n = len(starts)
    if n == 0:
        return np.empty(0, dtype=values.dtype), np.zeros(1, dtype=np.int64)
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2] = starts
    bounds[1::2] = stops
    return _take_blobs(values, bounds, np.arange(0, 2 * n, 2, dtype=np.int64))
