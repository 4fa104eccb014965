"""64-bit hashes of Arrow columns, computed on the buffers (no Python object per row).

The distinct-count sketch and the duplicate-id check both need a well-mixed 64-bit hash per
value. Arrow's own hash tables are slow for millions of distinct strings (they grow and miss the
cache), so strings are hashed here eight bytes at a time straight from the Arrow data buffer and
then checked by sorting the hashes, which numpy does in tens of milliseconds.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SEED = np.uint64(0x9E3779B97F4A7C15)
_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection on uint64 that spreads every input bit to every output bit."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def hash_numbers(values: np.ndarray) -> np.ndarray:
    """Hash integers (or floats, by their bits) to uint64."""
    values = np.ascontiguousarray(values)
    if values.dtype.kind == "f":
        values = values.astype(np.float64)
        values = np.where(values == 0.0, 0.0, values)  # -0.0 and 0.0 are one value
        bits = values.view(np.uint64)
    else:
        bits = values.astype(np.int64, copy=False).view(np.uint64)
    return mix64(bits ^ _SEED)


def _hash_string_array(arr: pa.Array, finalise: bool = True) -> np.ndarray:
    """Hash each value of a (large_)string/binary array; nulls hash like the empty string."""
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    off_type = np.int64 if large else np.int32
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=off_type, count=n + 1, offset=arr.offset * np.dtype(off_type).itemsize)
    start = offsets[:-1].astype(np.int64)
    length = offsets[1:].astype(np.int64) - start
    end = int(offsets[-1])
    data = np.frombuffer(data_buf, dtype=np.uint8, count=end) if data_buf is not None and end else np.zeros(0, np.uint8)
    max_len = int(length.max())
    is_text = pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
    if arr.null_count == 0 and 0 < max_len <= PAD_MAX_BYTES and is_text:
        fast = _hash_padded(arr, length, 8 * -(-max_len // 8), finalise)
        if fast is not None:
            return fast
    # Pad so that an 8-byte read at any byte offset stays inside the buffer, then view the
    # buffer as "the uint64 starting at each byte" (stride 1): one gather reads 8 bytes.
    padded = np.zeros(len(data) + 8, dtype=np.uint8)
    padded[: len(data)] = data
    words = np.ndarray(shape=(len(data) + 1,), dtype="<u8", buffer=padded, offset=0, strides=(1,))
    # Per 8-byte word: h = (h ^ word) * M1, h ^= h >> 32 (cheap, in place); one full mix64 at
    # the end spreads every bit. Rows shorter than the word are masked to their own bytes.
    h = length.astype(np.uint64)
    h ^= _SEED
    min_len = int(length.min())
    idx = np.empty_like(start)
    with np.errstate(over="ignore"):
        for j in range(0, max_len, 8):
            np.add(start, j, out=idx)
            np.minimum(idx, len(data), out=idx)
            word = words[idx]
            if j + 8 > min_len:
                rest = np.clip(length - j, 0, 8).astype(np.uint64)
                word &= np.where(rest >= 8, _ALL_ONES, (np.uint64(1) << (rest * np.uint64(8))) - np.uint64(1))
            _mix_words(h, word)
    return mix64(h) if finalise else h


PAD_MAX_BYTES = 64
"""Strings up to this long are hashed from a zero-padded fixed-width copy (`_hash_padded`)."""


def _mix_words(h: np.ndarray, word: np.ndarray) -> None:
    """One step of the per-word update, in place: h = (h ^ word) * M1; h ^= h >> 32."""
    with np.errstate(over="ignore"):
        h ^= word
        h *= _M1
        h ^= h >> np.uint64(32)


def _hash_padded(arr: pa.Array, length: np.ndarray, width: int, finalise: bool) -> np.ndarray | None:
    """`_hash_string_array` for strings of at most `width` bytes (a multiple of 8), without
    gathers or masks: Arrow pads every value with zero bytes to `width` (the masked word the
    general path reads past a value's end), and the padded data is an (n, width / 8) matrix
    of words. Same hashes; None if the padded layout is not the expected one."""
    n = len(arr)
    padded = pc.ascii_rpad(arr, width=width, padding="\0")
    _, off_buf, data_buf = padded.buffers()
    off_type = np.int64 if pa.types.is_large_string(padded.type) else np.int32
    offsets = np.frombuffer(off_buf, dtype=off_type, count=n + 1, offset=padded.offset * np.dtype(off_type).itemsize)
    first = int(offsets[0])
    if int(offsets[-1]) - first != n * width:  # every value padded to `width`, none longer
        return None
    words = np.frombuffer(data_buf, dtype="<u8", count=n * width // 8, offset=first).reshape(n, width // 8)
    h = length.astype(np.uint64)
    h ^= _SEED
    for j in range(width // 8):
        _mix_words(h, words[:, j])
    return mix64(h) if finalise else h


def hash_strings(values: pa.Array | pa.ChunkedArray, finalise: bool = True) -> np.ndarray:
    """uint64 hash of every string in an Arrow (chunked) array, in order. `finalise=False` skips
    the last mix64, a bijection: exactly the same strings collide, so a caller that only
    compares hashes for equality (the duplicate-id check) can save its passes."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    parts = [_hash_string_array(c, finalise) for c in chunks]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def hash_column(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """uint64 hash of each non-null value of an Arrow column (nulls are dropped first)."""
    if values.null_count:
        values = pc.drop_null(values)
    t = values.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return hash_strings(values)
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        values = pc.cast(values, pa.int64())
    return hash_numbers(values.to_numpy() if isinstance(values, pa.Array) else values.to_numpy())
