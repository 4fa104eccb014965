"""The Arrow form of the sequence feature, without Spark: each row's history is its user's last K
item ids before it, whatever the batch boundaries."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from spark_jobs.history import HIST_COLUMN, history_batches


def _expected(users: list[int], items: list[int], k: int) -> list[list[int]]:
    return [[items[j] for j in range(i) if users[j] == users[i]][-k:] for i in range(len(users))]


@pytest.mark.parametrize("seed", range(20))
def test_history_matches_the_definition_across_batch_boundaries(seed: int) -> None:
    rng = random.Random(seed)
    n, k = rng.randint(1, 80), rng.randint(1, 6)
    users = sorted(rng.choice([3, 7, 8, 20]) for _ in range(n))  # sorted by user, then time
    items = [rng.randint(0, 1_000) for _ in range(n)]
    table = pa.table({"user_id": pa.array(users, pa.int64()), "item_id": pa.array(items, pa.int64())})
    batches = table.to_batches(max_chunksize=rng.randint(1, 12))  # users straddle batches
    got = [h for b in history_batches(iter(batches), k) for h in b.column(HIST_COLUMN).to_pylist()]
    assert got == _expected(users, items, k)


def test_a_new_user_in_the_next_batch_starts_empty() -> None:
    batches = [
        pa.record_batch({"user_id": pa.array([1, 1], pa.int64()), "item_id": pa.array([10, 11], pa.int64())}),
        pa.record_batch({"user_id": pa.array([2, 2], pa.int64()), "item_id": pa.array([20, 21], pa.int64())}),
    ]
    out = [b.column(HIST_COLUMN).to_pylist() for b in history_batches(iter(batches), 5)]
    assert out == [[[], [10]], [[], [20]]]
