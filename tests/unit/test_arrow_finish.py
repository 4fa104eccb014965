"""The writer-side features (`hist_items`, categorical hashes) against a plain per-row reference,
over batch boundaries that split users' runs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from slipstream.samples.schema import hash_category
from spark_jobs.arrow_finish import SampleFinisher

CATS = (("device", "device_hash"), ("country", "country_hash"))


def _sorted_rows(n: int, users: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    user = np.sort(rng.integers(0, users, n))  # sorted by user; the row order within a user is time order
    return pa.table({
        "sample_id": [f"s{i}" for i in range(n)],
        "user_id": pa.array(user, pa.int64()),
        "item_id": pa.array(rng.integers(0, 50, n), pa.int64()),
        "device": rng.choice(["ios", "android", "web", "ünïcode"], n).tolist(),
        "country": rng.choice(["DE", "FR", "US"], n).tolist(),
        "label": pa.array(rng.integers(0, 2, n), pa.int32()),
    })


def _reference(t: pa.Table, k: int) -> dict[str, tuple[list[int], int, int]]:
    out: dict[str, tuple[list[int], int, int]] = {}
    seen: dict[int, list[int]] = {}
    for r in t.to_pylist():
        prev = seen.setdefault(r["user_id"], [])
        out[r["sample_id"]] = (prev[-k:] if k else [], hash_category(r["device"]), hash_category(r["country"]))
        prev.append(r["item_id"])
    return out


@pytest.mark.parametrize(("n", "users", "batch", "k"), [(500, 7, 13, 20), (500, 200, 3, 5), (60, 1, 7, 20), (40, 40, 5, 3)])
def test_history_and_hashes_equal_the_row_by_row_reference(n: int, users: int, batch: int, k: int) -> None:
    t = _sorted_rows(n, users, seed=n + users)
    finisher = SampleFinisher(hist_len=k, categoricals=CATS)
    got = pa.Table.from_batches(list(finisher(iter(t.to_batches(max_chunksize=batch)))))
    assert got.column_names == ["sample_id", "user_id", "item_id", "device_hash", "country_hash", "label", "hist_items"]
    assert got.schema.field("hist_items").type == pa.list_(pa.int64())
    want = _reference(t, k)
    for r in got.to_pylist():
        assert (r["hist_items"], r["device_hash"], r["country_hash"]) == want[r["sample_id"]], r["sample_id"]
    assert got["label"].to_pylist() == t["label"].to_pylist()


def test_a_new_task_starts_without_history() -> None:
    t = _sorted_rows(30, 1, seed=3)
    first = pa.Table.from_batches(list(SampleFinisher(categoricals=CATS)(iter(t.to_batches(max_chunksize=10)))))
    again = pa.Table.from_batches(list(SampleFinisher(categoricals=CATS)(iter(t.slice(10).to_batches(max_chunksize=10)))))
    assert first["hist_items"][10].as_py() == t["item_id"].to_pylist()[:10]
    assert again["hist_items"][0].as_py() == []


def test_dedupe_drops_the_copies_after_the_first_even_across_batches() -> None:
    # sorted by (user, time, id, item): the first copy of each (user, id) is the one to keep
    t = pa.table({
        "sample_id": ["a", "a", "b", "c", "c", "c", "d", "a"],
        "user_id": pa.array([1, 1, 1, 1, 1, 1, 2, 2], pa.int64()),
        "item_id": pa.array([10, 11, 12, 13, 14, 15, 20, 21], pa.int64()),
        "device": ["ios"] * 8,
        "country": ["DE"] * 8,
        "label": pa.array([1, 0, 0, 0, 0, 0, 1, 1], pa.int32()),
    })
    for batch in (1, 2, 3, 5, 8):
        finisher = SampleFinisher(hist_len=20, categoricals=CATS, dedupe=True)
        got = pa.Table.from_batches(list(finisher(iter(t.to_batches(max_chunksize=batch)))))
        # "a" of user 2 is not next to user 1's "a": kept here, left to the job's check
        assert got["sample_id"].to_pylist() == ["a", "b", "c", "d", "a"], batch
        assert got["item_id"].to_pylist() == [10, 12, 13, 20, 21], batch
        assert got["hist_items"].to_pylist() == [[], [10], [10, 12], [], [20]], batch
        assert got["label"].to_pylist() == [1, 0, 0, 1, 1], batch
        assert finisher.dropped == 3, batch


def test_without_dedupe_every_row_stays() -> None:
    t = _sorted_rows(20, 2, seed=1)
    t = pa.concat_tables([t.slice(0, 5), t.slice(4)])  # row 4 twice, side by side
    got = pa.Table.from_batches(list(SampleFinisher(categoricals=CATS)(iter(t.to_batches(max_chunksize=3)))))
    assert got.num_rows == 21
