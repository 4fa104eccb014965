"""`slipstream.schema.is_holdout` computed straight from an Arrow string column's buffers.

`is_holdout` takes any sequence and converts it through Python string objects; on the loader's
hot path that costs more than reading the row group. This computes the same FNV-1a hash over
the Arrow data buffer with numpy (a test checks both agree on every id).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from slipstream.schema import HOLDOUT_MODULO

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def holdout_mask(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """True where fnv1a64(sample_id) % HOLDOUT_MODULO == 0, like schema.is_holdout."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks() if ids.num_chunks != 1 else ids.chunk(0)
    if pa.types.is_large_string(ids.type):
        ids = ids.cast(pa.string())
    n = len(ids)
    if n == 0:
        return np.zeros(0, dtype=bool)
    ids = ids.fill_null("")
    bufs = ids.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=ids.offset + n + 1)[ids.offset :].astype(np.int64)
    first, last = int(offsets[0]), int(offsets[-1])
    lengths = offsets[1:] - offsets[:-1]
    width, shortest = int(lengths.max()), int(lengths.min())
    data = np.frombuffer(bufs[2], dtype=np.uint8)[first:last] if bufs[2] is not None else np.zeros(0, dtype=np.uint8)
    # zero padding, so that (start of a row + j) is a valid index for every row and every j < width
    data = np.concatenate([data, np.zeros(width + 1, dtype=np.uint8)])
    has_nul = bool((data[: last - first] == 0).any())
    pos = offsets[:-1] - first  # position of byte j of every row
    h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(width):
            byte = data[pos]
            if j >= shortest:  # rows shorter than j + 1 bytes read padding or the next row: no byte
                byte[lengths <= j] = 0
            if has_nul or j >= shortest:
                nxt = (h ^ byte) * _FNV_PRIME
                h = np.where(byte != 0, nxt, h)  # schema.id_hash skips NUL bytes (its padding)
            else:  # every row has byte j and none is NUL: update in place
                np.bitwise_xor(h, byte, out=h)
                np.multiply(h, _FNV_PRIME, out=h)
            pos += 1
    return h % np.uint64(HOLDOUT_MODULO) == 0
