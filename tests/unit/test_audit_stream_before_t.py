"""The audit counts a stream record before T that the table lacks as lost: the stream phase skips
every record before T as "already in the batch", so one that is not there was trained by
neither phase. (A `--stream-after` earlier than the run's T used to leave such rows, and the
audit said "0 lost".)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa

from slipstream.quality.audit import audit_run
from slipstream.samples.schema import is_holdout

UTC = UTC
T = datetime(2026, 11, 7, tzinfo=UTC)
TS = pa.timestamp("us", tz="UTC")


def _ids(prefix: str, n: int) -> list[str]:
    """n trainable ids (the holdout is never trained, so it is left out here)."""
    out, i = [], 0
    while len(out) < n:
        sid = f"{prefix}-{i}"
        i += 1
        if not is_holdout([sid])[0]:
            out.append(sid)
    return out


def _audit_rows(ids: list[str], source: str) -> pa.Table:
    n = len(ids)
    return pa.table({"sample_id": ids, "source": [source] * n, "epoch": pa.array(np.zeros(n, np.int32)),
                     "partition": pa.array(np.zeros(n, np.int32)), "offset": pa.array(np.arange(n), pa.int64()),
                     "step": pa.array(np.arange(n), pa.int64())})


def test_stream_rows_before_t_missing_from_the_table_are_lost() -> None:
    table_ids = _ids("hist", 50)  # the window [T - 2 days, T): trained in the batch phase
    table_times = pa.array([T - timedelta(days=1, hours=i % 20) for i in range(50)], TS)
    gap = _ids("gap", 25)  # streamed from 2026-11-06T12:00 on, before T: in neither store's trained part
    tail = _ids("tail", 10)  # at or after T: trained in the stream phase
    kafka = pa.table({
        "sample_id": gap + tail,
        "event_time": pa.array([T - timedelta(hours=12) + timedelta(minutes=20 * i) for i in range(25)]
                               + [T + timedelta(minutes=i) for i in range(10)], TS),
        "partition": pa.array(np.zeros(35, np.int32)), "offset": pa.array(np.arange(35), pa.int64()),
    })
    audit = pa.concat_tables([_audit_rows(table_ids, "iceberg"), _audit_rows(tail, "kafka")])
    metrics = {"t_handoff": T.isoformat(), "window_start": (T - timedelta(days=2)).isoformat()}
    res = audit_run(audit, pa.array(table_ids), table_times, metrics, kafka)
    by_source = {s.source: s for s in res.sources}
    assert (by_source["iceberg"].lost, by_source["kafka"].lost) == (0, 0)  # what each phase was given: all trained
    before = by_source["kafka before T"]
    assert (before.expected, before.trained_rows, before.lost) == (25, 0, 25) and before.lost_examples[:2] == gap[:2]
    assert not res.exactly_once
    assert any("25 not in it (lost: in neither the table nor the trained stream)" in n for n in res.notes)

    # the same stream when the import wrote every event to the raw zone: the table holds the gap
    res = audit_run(pa.concat_tables([_audit_rows(table_ids + gap, "iceberg"), _audit_rows(tail, "kafka")]),
                    pa.array(table_ids + gap), pa.concat_arrays([table_times, kafka.column("event_time").combine_chunks()[:25]]),
                    metrics, kafka)
    assert {s.source: s.lost for s in res.sources} == {"iceberg": 0, "kafka": 0, "kafka before T": 0} and res.exactly_once


def test_stream_rows_before_the_window_are_outside_the_run() -> None:
    kafka = pa.table({"sample_id": ["old-1"], "event_time": pa.array([T - timedelta(days=30)], TS),
                      "partition": pa.array([0], pa.int32()), "offset": pa.array([0], pa.int64())})
    metrics = {"t_handoff": T.isoformat(), "window_start": (T - timedelta(days=2)).isoformat()}
    res = audit_run(_audit_rows(["x"], "iceberg"), pa.array(["x"]), pa.array([T - timedelta(hours=1)], TS), metrics, kafka)
    assert next(s for s in res.sources if s.source == "kafka before T").lost == 0
    assert any("1 before the window (outside the run)" in n for n in res.notes)
