"""The gate's fast paths give exactly what the plain per-row computation gives: quantile
buckets per cell of float32 bit patterns and per distinct integer, strings hashed from a padded
copy, duplicate ids, distinct values and counts of ids and categories, CTR per hour."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slipstream.quality import column_kernels, hashing, metrics
from slipstream.quality.hashing import hash_column, hash_strings
from slipstream.quality.metrics import duplicate_ids
from slipstream.quality.profiles import US_PER_HOUR, profile_table
from slipstream.quality.sketches import HyperLogLog, LogHistogram
from slipstream.samples.schema import DEFAULT_SPEC as SPEC


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
def test_cell_histogram_equals_per_value_histogram(sign: str) -> None:
    rng = np.random.default_rng(3)
    x = _boundary_values(rng, 100_000)
    if sign == "mixed":
        x = np.where(rng.random(len(x)) < 0.4, -x, x)
    else:
        x = np.abs(x)  # no sign bit anywhere: every value takes the per-cell path
    plain, fast, chunked = LogHistogram(), LogHistogram(), LogHistogram()
    plain.add(x)
    fast.add_float32(x)
    chunked.add_float32([x[:7], x[7:7], x[7:60_000], x[60_000:]])  # a column's chunks
    assert fast.to_dict() == plain.to_dict()
    assert chunked.to_dict() == plain.to_dict()
    for labels in (rng.integers(-3, 150_000, 50_000), rng.integers(0, 2, 50_000)):
        plain, fast = LogHistogram(), LogHistogram()
        plain.add(labels.astype(np.int32))
        col = pa.chunked_array([pa.array(labels[:9_000], pa.int32()), pa.array(labels[9_000:], pa.int32())])
        counted = column_kernels.small_int_counts(col)
        assert counted is not None
        fast.add_counted(*counted)
        assert fast.to_dict() == plain.to_dict()
        keys, counts = counted
        assert keys.tolist() == sorted(set(labels.tolist())) and int(counts.sum()) == len(labels)
    for sparse in (rng.integers(-3, 400_000, 50_000), rng.integers(-2**31, 2**31 - 1, 5_000)):
        assert column_kernels.small_int_counts(pa.array(sparse, pa.int32())) is None
    assert column_kernels.small_int_counts(pa.array([1, 2], pa.int64())) is None  # wider than 32 bits
    with pytest.raises(ValueError, match="use add"):
        LogHistogram().add_float32(x.astype(np.float64))


def test_cell_histogram_of_every_float32_in_a_range() -> None:
    # every float32 from below min_value to 2: each bucket boundary and min_value itself
    # fall inside some cell, whose values must then be split one by one
    lo = np.float32(5e-10).view(np.int32)
    hi = np.float32(2.0).view(np.int32)
    x = np.arange(lo, hi, 97, dtype=np.int32).view(np.float32)
    plain, fast = LogHistogram(), LogHistogram()
    plain.add(x)
    fast.add_float32(x)
    assert fast.to_dict() == plain.to_dict()
    assert plain.zero and len(plain.positive) > 1000


def test_profiling_leaves_the_table_unchanged() -> None:
    # the numeric and categorical paths work on numpy views of Arrow's buffers: never write them
    rng = np.random.default_rng(4)
    parts = [pa.array(rng.random(1_000).astype(np.float32)) for _ in range(3)]
    for col in (pa.chunked_array(parts), pa.chunked_array(parts[:1]), parts[0]):
        table = pa.table({"price_log": col, "label": pa.array(rng.integers(0, 2, len(col)), pa.int32())})
        before = [c.to_pylist() for c in table.columns]
        profile_table(table, SPEC)
        assert [c.to_pylist() for c in table.columns] == before


def test_numeric_profile_min_max_keep_arrows_answer() -> None:
    # min/max come from numpy; Arrow's order-dependent sign of a zero min or max stays
    for values in ([0.0, -0.0, 0.5], [-0.0, 0.0, 0.5], [-0.0, 0.25], [0.75, 0.25]):
        arr = pa.array(values, pa.float32())
        col = profile_table(pa.table({"price_log": arr}), SPEC).columns["price_log"]
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
    prof = profile_table(table, SPEC)
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
        hours = us // US_PER_HOUR
        want = {int(h): (int((hours == h).sum()), int(labels[hours == h].sum())) for h in np.unique(hours)}
        prof = profile_table(pa.table({"event_time": ts, "label": pa.array(labels)}), SPEC)
        assert prof.ctr_by_hour == want
        # columns chunked at different rows (as concatenated reads can be)
        chunked = pa.table({
            "event_time": pa.chunked_array([ts.slice(0, 1_000), ts.slice(1_000, 30_000), ts.slice(31_000)]),
            "label": pa.chunked_array([pa.array(labels[:25_000]), pa.array(labels[25_000:])]),
        })
        assert profile_table(chunked, SPEC).ctr_by_hour == want


@pytest.mark.parametrize("distinct", [1, 12, 3_000, 40_000])
def test_category_counts_with_slot_collisions_match_arrow(distinct: int) -> None:
    # thousands of values in the 2**14-slot table collide; values sharing their low 40 bits too
    rng = np.random.default_rng(distinct)
    pool = np.concatenate([rng.integers(-2**62, 2**62, distinct), np.arange(50) << 40])
    parts = [pa.array(pool[rng.integers(0, len(pool), k)], pa.int64()) for k in (70_000, 0, 1, 30_000)]
    col = pa.chunked_array(parts)
    values, counts = column_kernels.value_counts(col)
    vc = pc.value_counts(col)
    assert values.type == pa.int64()
    expected = sorted(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()))
    assert sorted(zip(values.to_pylist(), counts.tolist())) == expected


@pytest.mark.parametrize("n", [1, 3, 5_000, 300_000])
def test_repeated_hashes_are_exactly_the_values_seen_more_than_once(n: int) -> None:
    rng = np.random.default_rng(n)
    cases = {
        "random": rng.integers(0, 2**63, n, dtype=np.int64).view(np.uint64) * np.uint64(2),
        "consecutive": np.arange(n, dtype=np.uint64),
    }
    for name, h in cases.items():
        h = h.copy()
        h[rng.integers(0, n, 4)] = h[rng.integers(0, n, 4)]  # a few repeats, some maybe three times
        want = sorted(v for v, k in Counter(h.tolist()).items() if k > 1)
        assert np.sort(metrics.repeated_hashes(h)).tolist() == want, name
        assert want or n < 5_000, name  # the large cases do contain repeats


def test_list_length_counts_equal_counting_arrow_list_value_length() -> None:
    rng = np.random.default_rng(4)
    lists = [list(range(k)) for k in rng.integers(0, 25, 3_000)]
    lists[1_500] = list(range(70_000))  # a runaway length: counted without a 70k-slot table
    for typ in (pa.list_(pa.int64()), pa.large_list(pa.int64())):
        arr = pa.array(lists, typ)
        col = pa.chunked_array([arr.slice(0, 1_000), arr.slice(1_000, 0), arr.slice(1_000)])  # sliced chunks, one empty
        want = Counter(pc.list_value_length(col).to_numpy().tolist())
        keys, counts = column_kernels.list_length_counts(col)
        assert keys.dtype == np.int64 and dict(zip(keys.tolist(), counts.tolist())) == want
        keys, counts = column_kernels.list_length_counts(arr.slice(7, 50))
        assert dict(zip(keys.tolist(), counts.tolist())) == Counter(len(x) for x in lists[7:57])
    empty = column_kernels.list_length_counts(pa.array([], pa.list_(pa.int64())))
    assert len(empty[0]) == 0 and len(empty[1]) == 0
