"""The last two sample features, computed on the Arrow batches the writer receives: `hist_items`
and the categorical hashes. No pyspark here: this runs inside the writer's `mapInArrow` tasks
(and in tests on plain Arrow tables).

Why here and not in Spark: Spark built every row's `hist_items` array in the JVM (a per-user
`collect_list` of structs, an interpreted `array_sort`, a slice per row) and then converted those
arrays to Arrow for the writer, and it hashed every categorical value with SHA-256 although a day
holds a handful of distinct values. The writer gets the rows sorted by (user_id, event_time,
sample_id) instead and slices each user's item ids with NumPy, and hashes each distinct string
once (`hash_category`, the same numbers as `conv(substring(sha2(x, 256), 1, 15), 16, 10)`).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.samples.schema import CATEGORICAL_FEATURES, HIST_LEN, SEQUENCE_COLUMN, hash_category


class SampleFinisher:
    """Streams batches sorted by (user_id, event_time, sample_id) within one task and adds
    `hist_items` (the user's previous `hist_len` item ids, most recent last, no padding) and the
    hashed categoricals (dropping the raw strings).

    A user's rows may span batches: the last `hist_len` item ids of the previous batch's last
    user are carried over, which is all the history the next rows of that user can see.
    """

    def __init__(self, hist_len: int = HIST_LEN,
                 categoricals: Iterable[tuple[str, str]] = CATEGORICAL_FEATURES, dedupe: bool = False) -> None:
        self.hist_len = hist_len
        self.categoricals = tuple(categoricals)
        self.dedupe = dedupe
        """Drop a row whose (user_id, sample_id) equals the previous row's (the input order puts
        the copy to keep first; see `transforms.unfinished_samples_one_shuffle`)."""
        self.dropped = 0
        self._last_key: tuple[int, str] | None = None
        self._hashes: dict[str, int] = {}
        self._carry_user: int | None = None
        self._carry_items = np.empty(0, dtype=np.int64)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if self.dedupe and batch.num_rows:
                batch = self._drop_adjacent_copies(batch)
            if batch.num_rows:
                yield self.finish(batch)

    def _drop_adjacent_copies(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        users = batch.column("user_id").to_numpy(zero_copy_only=False)
        ids = batch.column("sample_id")
        same = np.zeros(batch.num_rows, dtype=bool)
        if batch.num_rows > 1:
            same[1:] = (users[1:] == users[:-1]) & pc.equal(ids[1:], ids[:-1]).to_numpy(zero_copy_only=False)
        if self._last_key is not None:
            same[0] = (int(users[0]), ids[0].as_py()) == self._last_key
        self._last_key = (int(users[-1]), ids[-1].as_py())
        n = int(np.count_nonzero(same))
        if not n:
            return batch
        self.dropped += n
        return batch.filter(pa.array(~same))

    def finish(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        users = batch.column("user_id").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        items = batch.column("item_id").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        hist = self._history(users, items)
        names, cols = [], []
        hashed = {raw: out for raw, out in self.categoricals}
        for name, col in zip(batch.schema.names, batch.columns):
            if name in hashed:
                names.append(hashed[name])
                cols.append(self._hash_column(col))
            else:
                names.append(name)
                cols.append(col)
        return pa.RecordBatch.from_arrays([*cols, hist], names=[*names, SEQUENCE_COLUMN])

    def _history(self, users: np.ndarray, items: np.ndarray) -> pa.ListArray:
        carry = self._carry_items if users[0] == self._carry_user else self._carry_items[:0]
        c = len(carry)
        all_items = np.concatenate([carry, items]) if c else items
        all_users = np.concatenate([np.full(c, users[0], dtype=np.int64), users]) if c else users
        n = len(all_users)
        idx = np.arange(n, dtype=np.int64)
        new_run = np.ones(n, dtype=bool)
        new_run[1:] = all_users[1:] != all_users[:-1]
        run_start = np.maximum.accumulate(np.where(new_run, idx, 0))
        # Rows carried over hold at most hist_len items, so a position capped at hist_len is exact.
        lengths = np.minimum(idx - run_start, self.hist_len)[c:]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        # Row i's history is all_items[i + c - len_i : i + c]: one gather for the whole batch.
        first = np.repeat(idx[c:] - lengths, lengths)
        within = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1].astype(np.int64), lengths)
        values = all_items[first + within]
        last_user = int(users[-1])
        tail_start = max(int(run_start[-1]), n - self.hist_len)
        self._carry_user, self._carry_items = last_user, all_items[tail_start:].copy()
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64()))

    def _hash_column(self, col: pa.Array) -> pa.Array:
        encoded = pc.dictionary_encode(col)
        table = np.array([self._hash(v) for v in encoded.dictionary.to_pylist()], dtype=np.int64)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        return pa.array(table[codes], pa.int64())

    def _hash(self, value: str) -> int:
        h = self._hashes.get(value)
        if h is None:
            h = self._hashes[value] = hash_category(value)
        return h
