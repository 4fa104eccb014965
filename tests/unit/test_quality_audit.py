"""Exactly-once comparison and the shuffle score, on plain Arrow data."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from slipstream.quality.audit import compare_ids, shuffle_score


def _audit(ids: list[str], steps: np.ndarray) -> pa.Table:
    n = len(ids)
    return pa.table({
        "sample_id": pa.array(ids), "source": pa.array(["iceberg"] * n), "epoch": pa.array(np.zeros(n, np.int32)),
        "partition": pa.array(np.full(n, -1, np.int32)), "offset": pa.array(np.full(n, -1, np.int64)),
        "step": pa.array(steps, pa.int64()),
    })


def test_compare_ids_names_lost_duplicated_and_unexpected() -> None:
    expected = pa.array([f"s{i}" for i in range(100)])
    trained = pa.array([f"s{i}" for i in range(3, 100)] + ["s10", "s10", "s11", "x1"])
    a = compare_ids("iceberg", 0, expected, trained)
    assert (a.lost, a.duplicated, a.unexpected) == (3, 3, 1)
    assert a.lost_examples == ["s0", "s1", "s2"]
    assert sorted(a.duplicated_examples) == ["s10", "s11"]
    assert a.unexpected_examples == ["x1"] and not a.exactly_once
    assert compare_ids("iceberg", 0, expected, expected).exactly_once


def test_shuffle_score_separates_time_order_from_a_shuffle() -> None:
    n = 5_000
    ids = pa.array([f"s{i}" for i in range(n)])
    times = pa.array(np.arange(n) * 1_000_000, pa.timestamp("us", tz="UTC"))
    in_order = _audit(ids.to_pylist(), np.arange(n) // 32)
    perm = np.random.default_rng(0).permutation(n)
    shuffled = _audit([f"s{i}" for i in perm], np.arange(n) // 32)
    assert shuffle_score(in_order, ids, times) < 0.01
    assert shuffle_score(shuffled, ids, times) > 0.95


def test_a_partial_last_epoch_is_not_loss_but_a_partial_first_epoch_is() -> None:
    from slipstream.quality.audit import audit_run

    n = 200
    ids = pa.array([f"s{i}" for i in range(n)])
    times = pa.array(np.arange(n) * 1_000_000, pa.timestamp("us", tz="UTC"))
    from slipstream.samples.schema import is_holdout

    train = [x for x, h in zip(ids.to_pylist(), is_holdout(ids)) if not h]
    e0 = _audit(train, np.arange(len(train)))
    e1 = _audit(train[:50], np.arange(50)).set_column(2, "epoch", pa.array(np.ones(50, np.int32)))
    res = audit_run(pa.concat_tables([e0, e1]), ids, times, {}, None)
    assert res.exactly_once and res.sources[1].partial and res.sources[1].lost == len(train) - 50
    assert any("epoch 1 is partial" in n for n in res.notes)
    short = audit_run(_audit(train[:-3], np.arange(len(train) - 3)), ids, times, {}, None)
    assert not short.exactly_once and short.sources[0].lost == 3
