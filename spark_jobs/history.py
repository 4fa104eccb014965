"""The sequence feature `hist_items` on Arrow batches: each impression's user's last K item ids
before it, most recent last, no padding.

Spark hands a partition to `history_batches` as a stream of Arrow batches, already sorted by
(user_id, event_time, sample_id) with every row of a user in that partition. Each batch is done
with a few vectorised NumPy operations (no per-row Python); a user whose rows straddle two
batches continues from the last K items carried over from the previous batch.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa

HIST_COLUMN = "hist_items"


def _run_starts(users: np.ndarray) -> np.ndarray:
    """For each position of a sorted `users` array, the position where its user's run begins."""
    starts = np.zeros(len(users), dtype=np.int64)
    changed = np.flatnonzero(users[1:] != users[:-1]) + 1
    starts[changed] = changed
    return np.maximum.accumulate(starts)


def history_lists(users: np.ndarray, items: np.ndarray, hist_len: int, carry: np.ndarray | None = None
                  ) -> tuple[pa.ListArray, np.ndarray]:
    """`hist_items` for rows sorted by user then time, and the carry for the next batch.

    `carry` holds the last (up to `hist_len`) items of `users[0]` seen before this batch; the
    returned carry is the same for the batch's last user.
    """
    prev = carry if carry is not None else np.empty(0, dtype=np.int64)
    p = len(prev)
    ext_users = np.concatenate([np.full(p, users[0], dtype=users.dtype), users]) if p else users
    ext_items = np.concatenate([prev, items]) if p else items
    starts = _run_starts(ext_users)
    pos = np.arange(p, len(ext_users), dtype=np.int64)
    lo = np.maximum(starts[p:], pos - hist_len)
    lengths = pos - lo
    offsets = np.zeros(len(pos) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    # Row r's items are ext_items[lo[r] : pos[r]], laid out one after another.
    gather = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1] - lo, lengths)
    values = pa.array(ext_items[gather], type=pa.int64())
    lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
    next_carry = ext_items[max(starts[-1], len(ext_items) - hist_len):].copy() if len(ext_items) else prev
    return lists, next_carry


def history_batches(batches: Iterator[pa.RecordBatch], hist_len: int, user_col: str = "user_id",
                    item_col: str = "item_id") -> Iterator[pa.RecordBatch]:
    """Append `hist_items` to a partition's batches (sorted by user, then event time, then id)."""
    last_user: object = None
    carry = np.empty(0, dtype=np.int64)
    for batch in batches:
        if batch.num_rows == 0:
            continue
        users = batch.column(user_col).to_numpy(zero_copy_only=False)
        items = batch.column(item_col).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        lists, carry = history_lists(users, items, hist_len, carry if users[0] == last_user else None)
        last_user = users[-1]
        yield batch.append_column(HIST_COLUMN, lists)
