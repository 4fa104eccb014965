"""The gate's fast paths give exactly what the plain per-row computation gives: quantile
buckets by sort + bisection, strings hashed from a padded copy, duplicate ids, distinct values
and counts of ids and categories, CTR per hour."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slipstream.quality import hashing
from slipstream.quality.hashing import hash_column, hash_strings
from slipstream.quality.metrics import duplicate_ids
from slipstream.quality.profiles import US_PER_HOUR, profile_table
from slipstream.quality.sketches import HyperLogLog, LogHistogram


def _boundary_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 values on and next to the sketch's bucket boundaries gamma**k, plus zeros of both
    signs and values around min_value: where a rounding slip would move a value to another bucket."""
    gamma = LogHistogram().gamma
    edge = np.power(gamma, rng.integers(-1100, 60, n).astype(np.float64)).astype(np.float32)
    step = rng.integers(-2, 3, n)
    x = edge.copy()
    for s in (-2, -1, 1, 2):
        x = np.where(step == s, np.nextafter(x, np.float32(np.sign(s) * np.inf)), x)
    tiny = np.float32(1e-9)
    x[:300] = 0.0
    x[300:600] = -0.0
    x[600:700] = tiny
    x[700:800] = np.nextafter(tiny, np.float32(0))
    x[800:900] = np.nextafter(tiny, np.float32(1))
    return x


@pytest.mark.parametrize("sign", ["positive", "mixed"])
def test_sorted_histogram_equals_per_value_histogram(sign: str) -> None:
    rng = np.random.default_rng(3)
    x = _boundary_values(rng, 100_000)
    if sign == "mixed":
        x = np.where(rng.random(len(x)) < 0.4, -x, x)
    plain, fast = LogHistogram(), LogHistogram()
    plain.add(x)
    fast.add_sorted(np.sort(x))
    assert fast.to_dict() == plain.to_dict()
    labels = rng.integers(-3, 400_000, 50_000).astype(np.int32)
    plain, fast = LogHistogram(), LogHistogram()
    plain.add(labels)
    fast.add_sorted(np.sort(labels))
    assert fast.to_dict() == plain.to_dict()
    with pytest.raises(ValueError, match="use add"):
        LogHistogram().add_sorted(np.sort(x.astype(np.float64)))


def test_profiling_leaves_the_table_unchanged() -> None:
    # the numeric path sorts the column's numpy copy in place: never Arrow's own buffers
    rng = np.random.default_rng(4)
    parts = [pa.array(rng.random(1_000).astype(np.float32)) for _ in range(3)]
    for col in (pa.chunked_array(parts), pa.chunked_array(parts[:1]), parts[0]):
        table = pa.table({"price_log": col, "label": pa.array(rng.integers(0, 2, len(col)), pa.int32())})
        before = [c.to_pylist() for c in table.columns]
        profile_table(table)
        assert [c.to_pylist() for c in table.columns] == before


def test_numeric_profile_min_max_keep_arrows_answer() -> None:
    # the sorted path takes min/max from the sort; Arrow's order-dependent sign of a zero min stays
    for values in ([0.0, -0.0, 0.5], [-0.0, 0.0, 0.5], [-0.0, 0.25], [0.75, 0.25]):
        arr = pa.array(values, pa.float32())
        col = profile_table(pa.table({"price_log": arr})).columns["price_log"]
        mm = pc.min_max(arr).as_py()
        assert (str(col.min), str(col.max)) == (str(float(mm["min"])), str(float(mm["max"])))


def test_padded_string_hash_equals_general_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    words = ["", "a", "é", "abcdefgh", "abcdefgh\0", "abcdefghi", "x" * 40, "imp-0007-100", "r3-imp-0001-7"]
    values = [words[i] + str(j) * (j % 3) for j, i in enumerate(rng.integers(0, len(words), 5_000))]
    arrays = [pa.array(values), pa.array(values).slice(7, 3_000), pa.array(values, pa.large_string())]
    fast = [hash_strings(a) for a in arrays]
    unmixed = [hash_strings(a, finalise=False) for a in arrays]
    monkeypatch.setattr(hashing, "PAD_MAX_BYTES", 0)  # force the gather-and-mask path
    for a, f, u in zip(arrays, fast, unmixed):
        np.testing.assert_array_equal(f, hash_strings(a))
        np.testing.assert_array_equal(u, hash_strings(a, finalise=False))
        np.testing.assert_array_equal(f, hashing.mix64(u))


def test_duplicate_ids_are_counted_and_named_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [f"imp-{i:06d}-{i % 13}" for i in range(20_000)]
    dup = pa.array(ids + ids[100:103] + ids[100:101] + [None, None])
    surplus, names = duplicate_ids(dup)
    assert surplus == 4  # imp-000100 three times, 101 and 102 twice; nulls are not ids
    assert sorted(names) == sorted(ids[100:103])
    assert duplicate_ids(pa.chunked_array([pa.array(ids[:9_000]), pa.array(ids[9_000:])])) == (0, [])
    # every hash colliding: the strings themselves decide, so nothing is counted twice or missed
    monkeypatch.setattr("slipstream.quality.metrics.hash_strings", lambda v, finalise=True: np.zeros(len(v), np.uint64))
    assert duplicate_ids(pa.array(ids[:500])) == (0, [])
    assert duplicate_ids(pa.array(ids[:500] + ids[7:8]))[0] == 1


def test_distinct_ids_and_category_counts_match_arrow() -> None:
    rng = np.random.default_rng(9)
    n = 60_000
    table = pa.table({
        "user_id": pa.array(rng.integers(0, 5_000, n), pa.int64()),  # dense: bitmap
        "item_id": pa.array(rng.integers(0, 2**40, n), pa.int64()),  # sparse: Arrow's hash table
        "device_hash": pa.array(rng.choice([7 << 56, 3, 2**59 + 5, 11], n), pa.int64()),
        "category_hash": pa.array(rng.integers(0, 2**60, 400)[rng.integers(0, 400, n)], pa.int64()),
    })
    prof = profile_table(table)
    for name in table.column_names:
        col = table.column(name)
        expected = HyperLogLog()
        expected.add_hashes(hash_column(pc.unique(col)))
        assert np.array_equal(prof.columns[name].hll.registers, expected.registers), name  # type: ignore[union-attr]
    for name in ("device_hash", "category_hash"):
        vc = pc.value_counts(table.column(name))
        want = dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()))
        topk = prof.columns[name].topk
        assert topk is not None
        if topk.exact:
            assert topk.counts == want
        else:  # past capacity: the kept counts are the exact counts of the most frequent values
            assert all(want[v] == c for v, c in topk.counts.items())
            assert sum(topk.counts.values()) + topk.other == n


def test_ctr_by_hour_counts_rows_and_clicks() -> None:
    rng = np.random.default_rng(2)
    us = rng.integers(0, 30 * US_PER_HOUR, 40_000) + 1_790_000_000 * 1_000_000
    lab = (rng.random(40_000) < 0.2).astype(np.int32)
    ts = pa.array(us, pa.timestamp("us", tz="UTC"))
    for labels in (lab, np.where(np.arange(40_000) == 5, 2, lab).astype(np.int32)):  # 0/1, and a bad label
        prof = profile_table(pa.table({"event_time": ts, "label": pa.array(labels)}))
        hours = us // US_PER_HOUR
        want = {int(h): (int((hours == h).sum()), int(labels[hours == h].sum())) for h in np.unique(hours)}
        assert prof.ctr_by_hour == want
