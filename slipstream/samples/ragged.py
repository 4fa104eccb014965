"""Gathers of variable-length ranges (a history list per row, a field inside each record).

numpy can only gather ragged ranges value by value (an index per value). Lists are gathered by
`slipstream.samples.native` (one prefetched memcpy per list, straight from the Arrow chunks) where it is
built; otherwise, and for the ranges of `take_ranges`, Arrow's binary `take` copies each range as
one block: each range is handed to Arrow as one binary value over the numpy buffer (zero-copy), and
the gathered bytes come back as a numpy array (zero-copy). Both paths give the same arrays.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.samples import native


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
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    kern = native.kernels()
    if kern is None or len(idx) == 0:
        return _take_blobs(values, offsets, idx)
    values = np.ascontiguousarray(values)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if len(offsets) and (offsets[0] < 0 or offsets[-1] > len(values) or (offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"list offsets must ascend within the {len(values)} values "
                         f"(got {offsets[0]}..{offsets[-1]}): the lists are corrupt")
    return _native_take(kern.take_lists_i64, idx, [(values.ctypes.data, offsets.ctypes.data, len(offsets) - 1)],
                        values.dtype, int(offsets[-1] - offsets[0]), lambda: np.diff(offsets)[idx])


def flat_list(arr: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values int64, offsets int64 of length n+1) of a list<int64> column, nulls as empty lists."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.null_count:
        arr = pc.if_else(pc.is_null(arr), pa.scalar([], arr.type), arr)
    if arr.offset:  # a sliced array: make offsets start at zero
        arr = pa.concat_arrays([arr])
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return values[offsets[0] : offsets[-1]], offsets - offsets[0]


def take_list_column(column: pa.ChunkedArray | pa.Array, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values int64, offsets int64) of the lists at rows `idx` of a list<int64> column, nulls as
    empty lists: `take_lists(*flat_list(column), idx)`, but with the native kernel it reads every
    chunk in place (no combined copy of the column first)."""
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    kern = native.kernels()
    plain = all(c.null_count == 0 and c.values.null_count == 0 and pa.types.is_int64(c.type.value_type)
                and (pa.types.is_list(c.type) or pa.types.is_large_list(c.type)) for c in chunks)
    if kern is None or not plain or not chunks or len(idx) == 0:
        return take_lists(*flat_list(column), idx)
    large = pa.types.is_large_list(chunks[0].type)  # one type for every chunk of a column
    width = 8 if large else 4
    segments = []
    offsets = []
    for c in chunks:
        _, offsets_buf, _, values_buf = c.buffers()
        count = c.offset + len(c) + 1
        offsets.append(np.frombuffer(offsets_buf, dtype=np.int64 if large else np.int32, count=count)[c.offset :])
        values_at = values_buf.address + 8 * c.values.offset if values_buf is not None else 0
        segments.append((values_at, offsets_buf.address + width * c.offset, len(c)))
    total = sum(int(o[-1] - o[0]) for o in offsets)

    def lengths() -> np.ndarray:
        picked: np.ndarray = np.concatenate([np.diff(o) for o in offsets])[idx]
        return picked

    fn = kern.take_lists_i64 if large else kern.take_lists_i32
    return _native_take(fn, idx, segments, np.dtype(np.int64), total, lengths)


def _native_take(fn: object, idx: np.ndarray, segments: Sequence[tuple[int, int, int]], dtype: np.dtype,
                 capacity: int, lengths: object) -> tuple[np.ndarray, np.ndarray]:
    """Run a native list gather over segments (values address, offsets address, rows); the caller
    keeps the buffers behind the addresses alive. `capacity` (elements) suffices when no row is
    taken twice; otherwise `lengths()` gives the exact need."""
    rows = np.cumsum([0] + [n for _, _, n in segments], dtype=np.int64)
    if idx.min() < 0 or idx.max() >= rows[-1]:
        raise IndexError(f"list gather: row index out of range [0, {rows[-1]}) (got {idx.min()}..{idx.max()})")
    k = len(segments)
    values_at = (ctypes.c_void_p * k)(*[v for v, _, _ in segments])
    offsets_at = (ctypes.c_void_p * k)(*[o for _, o, _ in segments])
    out_offsets = np.empty(len(idx) + 1, dtype=np.int64)
    for _ in range(2):
        out = np.empty(capacity, dtype=dtype)
        written = fn(len(idx), idx.ctypes.data, k, rows.ctypes.data, values_at, offsets_at, dtype.itemsize,
                     out.ctypes.data, capacity, out_offsets.ctypes.data)  # type: ignore[operator]
        if written >= 0:
            return out[:written], out_offsets
        capacity = int(lengths().sum())  # type: ignore[operator]
    raise ValueError("list gather: the column's offsets are not ascending (a corrupt list array)")


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
