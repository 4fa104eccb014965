"""Exactly-once comparison and the shuffle score, on plain Arrow data."""

from __future__ import annotations

from datetime import UTC

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


def test_stream_records_after_the_final_position_are_unread_lag_unless_the_run_said_it_caught_up() -> None:
    from datetime import datetime

    from slipstream.quality.audit import audit_stream
    from slipstream.samples.schema import is_holdout

    ids = [f"k{i}" for i in range(400)]
    keep = [i for i, h in enumerate(is_holdout(pa.array(ids))) if not h]
    t = datetime(2026, 11, 3, tzinfo=UTC)
    kafka = pa.table({"sample_id": pa.array(ids), "event_time": pa.array([t] * 400, pa.timestamp("us", tz="UTC")),
                      "partition": pa.array(np.zeros(400, np.int32)), "offset": pa.array(np.arange(400) * 2, pa.int64())})
    trained = [ids[i] for i in keep if i < 100 or 150 <= i < 200]  # 100-149 passed over, 200+ not reached
    n = len(trained)
    audit = pa.table({"sample_id": pa.array(trained), "source": pa.array(["kafka"] * n),
                      "epoch": pa.array(np.zeros(n, np.int32)), "partition": pa.array(np.zeros(n, np.int32)),
                      "offset": pa.array(np.zeros(n, np.int64)), "step": pa.array(np.arange(n), pa.int64())})
    metrics = {"t_handoff": t.isoformat(), "final_offsets": {"0": 400}, "kafka_lag_at_stop": 7}
    res, notes, lag = audit_stream(audit, kafka, metrics)
    skipped = sum(1 for i in keep if 100 <= i < 150)
    assert res.lost == skipped and res.lost_where == [f"partition 0 offsets 200..298 ({skipped})"]
    assert res.unread == sum(1 for i in keep if i >= 200) and lag == {0: 200}
    caught_up, notes, _ = audit_stream(audit, kafka, {**metrics, "kafka_lag_at_stop": 0})
    assert caught_up.lost == skipped + res.unread and caught_up.unread == 0
    assert any("stopped as caught up (lag 0)" in n for n in notes)
