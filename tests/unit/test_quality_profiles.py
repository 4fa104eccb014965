"""Feature profiles merge across days to what profiling the union gives."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slipstream.quality.drift import compare_profiles, js_divergence, psi
from slipstream.quality.hashing import hash_numbers
from slipstream.quality.profiles import FeatureProfile, merge_profiles, profile_table
from slipstream.quality.sketches import HyperLogLog, LogHistogram
from slipstream.samples.schema import DEFAULT_SPEC as SPEC
from tests.quality_fixtures import reference_days, replace_column


def _days() -> list[pa.Table]:
    days = [t for _, t in sorted(reference_days().items())][:3]
    # plant nulls and a NaN so the null/nonfinite counts are exercised too
    x = days[1].column("price_log").to_numpy().copy()
    x[5] = np.nan
    mask = np.zeros(len(x), bool)
    mask[::100] = True
    days[1] = replace_column(days[1], "price_log", pa.array(x, pa.float32(), mask=mask))
    return days


def test_merged_profiles_equal_profile_of_union() -> None:
    days = _days()
    merged = merge_profiles(profile_table(t, SPEC) for t in days)
    union = profile_table(pa.concat_tables(days), SPEC)
    assert merged.rows == union.rows == sum(t.num_rows for t in days)
    assert merged.ctr_by_hour == union.ctr_by_hour
    for name, u in union.columns.items():
        m = merged.columns[name]
        got = (m.rows, m.nulls, m.nonfinite, m.count, m.min, m.max)
        assert got == (u.rows, u.nulls, u.nonfinite, u.count, u.min, u.max), name
        assert m.mean == pytest.approx(u.mean, rel=1e-9, abs=1e-12), name
        assert m.m2 == pytest.approx(u.m2, rel=1e-9, abs=1e-9), name
        assert m.lengths == u.lengths
        if u.hist is not None:
            assert m.hist.to_dict() == u.hist.to_dict(), name  # type: ignore[union-attr]
        if u.hll is not None:
            assert np.array_equal(m.hll.registers, u.hll.registers), name  # type: ignore[union-attr]
        if u.topk is not None:
            assert m.topk.counts == u.topk.counts, name  # type: ignore[union-attr]
    price = union.columns["price_log"]
    assert price.nulls == 40 and price.nonfinite == 1


def test_moments_quantiles_and_distinct_match_the_data() -> None:
    days = _days()
    union = pa.concat_tables(days)
    prof = merge_profiles(profile_table(t, SPEC) for t in days)
    x = union.column("item_age_log").to_numpy().astype(np.float64)
    col = prof.columns["item_age_log"]
    assert col.mean == pytest.approx(x.mean(), rel=1e-9)
    assert col.variance == pytest.approx(x.var(), rel=1e-7)
    qs = [0.01, 0.1, 0.5, 0.9, 0.99]
    est = col.hist.quantiles(qs)  # type: ignore[union-attr]
    exact = np.quantile(x, qs, method="lower")
    # DDSketch guarantee: relative error alpha (1 %) of a value of that rank
    np.testing.assert_allclose(est, exact, rtol=0.0101)
    users = union.column("user_id").to_numpy()
    assert prof.columns["user_id"].distinct() == pytest.approx(len(np.unique(users)), rel=0.05)
    assert prof.columns["device_hash"].distinct() == 4  # exact from top-k
    lab = union.column("label").to_numpy()
    assert prof.ctr == pytest.approx(lab.mean())
    label = prof.columns["label"]  # int32: moments and buckets from the count of each value
    assert (label.count, label.min, label.max) == (len(lab), float(lab.min()), float(lab.max()))
    assert label.variance == pytest.approx(lab.var(), rel=1e-12)
    lens = pc.list_value_length(union.column("hist_items")).to_numpy()
    assert prof.columns["hist_items"].lengths == {int(k): int(c) for k, c in zip(*np.unique(lens, return_counts=True))}


def test_profile_round_trips_through_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    prof = profile_table(_days()[1], SPEC)
    path = prof.write(tmp_path / "p.json")
    back = FeatureProfile.read(path)
    assert back.to_dict() == json.loads(prof.to_json())
    assert back.merge(prof).rows == 2 * prof.rows
    with pytest.raises(ValueError, match="re-profile"):
        FeatureProfile.from_dict({**prof.to_dict(), "version": 99})


def test_hll_error_at_scale() -> None:
    rng = np.random.default_rng(0)
    for n in (100, 50_000, 400_000):
        h = HyperLogLog()
        h.add_hashes(hash_numbers(rng.permutation(10 * n)[:n]))
        assert h.estimate() == pytest.approx(n, rel=0.05)
    # the small-batch (scatter-max) and large-batch (bincount) paths build the same registers
    hashes = hash_numbers(rng.permutation(10**6)[:100_000])
    small = HyperLogLog()
    for part in np.array_split(hashes, 50):
        small.add_hashes(part)
    big = HyperLogLog()
    big.add_hashes(hashes)
    assert np.array_equal(small.registers, big.registers)


def test_psi_and_js_detect_shift_not_noise() -> None:
    rng = np.random.default_rng(1)
    a, b, c = LogHistogram(), LogHistogram(), LogHistogram()
    a.add(rng.normal(5, 1, 50_000))
    b.add(rng.normal(5, 1, 50_000))
    c.add(rng.normal(5.8, 1, 50_000))
    assert psi(a, b) < 0.01
    assert psi(a, c) > 0.25
    assert js_divergence({"x": 50, "y": 50}, {"x": 51, "y": 49}) < 0.001
    assert js_divergence({"x": 100}, {"y": 100}) == pytest.approx(1.0)
    days = _days()
    shifts = {s.feature: s for s in compare_profiles(profile_table(days[0], SPEC), profile_table(days[2], SPEC), SPEC)}
    assert not any(s.drifted for s in shifts.values())


def test_incremental_updates_equal_one_profile() -> None:
    """The trainer profiles Kafka batches as they arrive; the result must not depend on batching."""
    t = _days()[1]
    inc = FeatureProfile.for_spec(SPEC)
    for b in t.to_batches(max_chunksize=700):
        inc.update(b)
    whole = profile_table(t, SPEC)
    for name, w in whole.columns.items():
        i = inc.columns[name]
        assert (i.rows, i.nulls, i.count, i.min, i.max, i.lengths) == (w.rows, w.nulls, w.count, w.min, w.max, w.lengths)
        assert i.mean == pytest.approx(w.mean, rel=1e-9, abs=1e-12)
        if w.hll is not None:
            assert np.array_equal(i.hll.registers, w.hll.registers), name  # type: ignore[union-attr]
        if w.hist is not None:
            assert i.hist.to_dict() == w.hist.to_dict(), name  # type: ignore[union-attr]
    assert inc.ctr_by_hour == whole.ctr_by_hour


def test_threaded_profile_equals_serial(monkeypatch: pytest.MonkeyPatch) -> None:
    from slipstream.quality import profiles

    t = pa.concat_tables(_days())
    serial = profile_table(t, SPEC).to_dict()
    monkeypatch.setattr(profiles, "PROFILE_THREADS", 2)
    monkeypatch.setattr(profiles, "PARALLEL_MIN_ROWS", 1)
    assert profile_table(t, SPEC).to_dict() == serial
