"""The sample joiner against a real broker (noida-db): raw impressions and clicks in, samples out.

- Skew: the samples equal, field by field, what the batch path's featurizer makes of the same
  events (labels by the same window rule, sequences by the same history), while bad records of
  every kind go to `<topic>.dlq` with their reason and stop nothing.
- Exactly once: the joiner is killed with SIGKILL mid-stream and restarted; the sample topic
  (read_committed) holds every expected sample exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from joiner_fixtures import START_US, US, batch_samples, headers_of, make_events, produce_raw, read_topic, start_joiner

from slipstream.samples.codec import decode_samples
from slipstream.samples.spec import load_spec

REPO_SPECS = Path(__file__).resolve().parents[2] / "specs"

pytestmark = pytest.mark.integration

SPEC = load_spec("synthetic")


def assert_same_samples(got: list[dict], expected: list[dict]) -> None:
    exp = {r["sample_id"]: r for r in expected}
    assert sorted(r["sample_id"] for r in got) == sorted(exp)
    for r in got:
        e = exp[r["sample_id"]]
        for col, v in e.items():
            if isinstance(v, float):
                assert abs(r[col] - v) <= 1e-6 * max(1.0, abs(v)), (r["sample_id"], col, r[col], v)
            else:
                assert r[col] == v, (r["sample_id"], col, r[col], v)


def _stop(proc) -> int:  # type: ignore[no-untyped-def]
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(60)


def test_joined_samples_equal_the_batch_path_and_bad_input_goes_to_dlq(kafka_bootstrap: str, tmp_path: Path) -> None:
    imp_t, clk_t, out_t = "imp-skew", "clk-skew", "samples-skew"
    imps, clicks, labels = make_events(3000, seed=11)
    produce_raw(kafka_bootstrap, imps, clicks, imp_t, clk_t)
    from slipstream.joiner.raw_topics import produce_events

    late_target = imps[-5]  # its window closes with the flush; a click after that is late
    bad_imps = [b"{not json", json.dumps({"impression_id": "no-user", "ts": "2026-11-01T00:10:00Z"}).encode()]
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": kafka_bootstrap})
    for v in bad_imps:
        p.produce(imp_t, value=v, key=b"1")
    p.flush(10)
    far = dict(imps[0], impression_id="far-future", ts=int((time.time() + 2 * 86400) * US))
    dup = dict(imps[100])
    ancient = dict(imps[1], impression_id="in-1971", ts=31_536_000 * US)  # a time no joiner should believe
    produce_events(kafka_bootstrap, imp_t, [far, dup, ancient], [far["user_id"], dup["user_id"], ancient["user_id"]], "ts")
    orphan = {"impression_id": "never-shown", "ts": START_US + 60 * US}
    produce_events(kafka_bootstrap, clk_t, [orphan], [0], "ts")

    proc = start_joiner(tmp_path, kafka_bootstrap, out_t, "--impressions-topic", imp_t, "--clicks-topic", clk_t,
                        "--group", "skew")
    try:
        msgs = read_topic(kafka_bootstrap, out_t, len(imps), timeout_s=120)
        late = {"impression_id": late_target["impression_id"], "ts": late_target["ts"] + 5 * US}
        produce_events(kafka_bootstrap, clk_t, [late], [late_target["user_id"]], "ts")
        dlq = read_topic(kafka_bootstrap, f"{imp_t}.dlq", 5, timeout_s=30, idle_s=1)
        dlq += read_topic(kafka_bootstrap, f"{clk_t}.dlq", 2, timeout_s=30, idle_s=1)
    finally:
        assert _stop(proc) == 0, (tmp_path / "joiner.log").read_text()[-3000:]

    decoded = decode_samples([m.value() for m in msgs], SPEC)
    assert not decoded.bad
    assert_same_samples(decoded.table.to_pylist(), batch_samples(SPEC, imps, labels).to_pylist())
    assert sum(labels.values()) > 100  # the window rule was exercised on both sides of the edge
    for m, r in zip(msgs, decoded.table.to_pylist()):  # keyed by user, timestamped by event time
        assert m.key() == str(r["user_id"]).encode()
        assert m.timestamp()[1] == int(r["event_time"].timestamp() * 1000)
    kinds = ("not JSON", "missing field user_id", "event time out of range", "duplicate impression id",
             "click without impression", "late click")
    found = Counter(next((k for k in kinds if headers_of(m)["reason"].startswith(k)), headers_of(m)["reason"]) for m in dlq)
    assert found == Counter(kinds) + Counter(["event time out of range"]), found  # 2100-ish and 1971
    reasons = " | ".join(headers_of(m)["reason"] for m in dlq)
    assert "impression time 1971-01-01T00:00:00Z is" in reasons and "days before this machine's clock" in reasons


def test_kill_9_mid_stream_then_restart_gives_each_sample_exactly_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The joiner is killed while input is still arriving (its transaction open), restarted, and
    reads on from its committed offsets: every sample once on a read_committed reader."""
    imp_t, clk_t, out_t = "imp-kill", "clk-kill", "samples-kill"
    imps, clicks, labels = make_events(6000, seed=12, span_s=4 * 3600)
    chunks = 30
    produce_raw(kafka_bootstrap, [], [], imp_t, clk_t)  # create the topics

    from slipstream.joiner.raw_topics import raw_producer

    producer = raw_producer(kafka_bootstrap)
    fed = {"chunks": 0}

    def feed() -> None:
        for i in range(chunks):  # in event-time order, as a live stream arrives
            lo, hi = i * len(imps) // chunks, (i + 1) * len(imps) // chunks
            t_lo = imps[lo]["ts"] if i else 0  # the clicks up to the next chunk's first impression
            t_hi = imps[hi]["ts"] if i < chunks - 1 else 1 << 62
            produce_raw(kafka_bootstrap, imps[lo:hi], [c for c in clicks if t_lo <= c["ts"] < t_hi], imp_t, clk_t,
                        producer=producer)
            fed["chunks"] = i + 1
            time.sleep(0.6)  # slower than a reader's start-up: the kill lands mid-input

    args = ("--impressions-topic", imp_t, "--clicks-topic", clk_t, "--group", "kill", "--idle-flush-s", "6")
    proc = start_joiner(tmp_path, kafka_bootstrap, out_t, *args)
    feeder = threading.Thread(target=feed)
    try:
        _wait_assigned(tmp_path / "joiner.log", proc)  # the stream starts once the joiner reads
        feeder.start()
        first = read_topic(kafka_bootstrap, out_t, 1, timeout_s=60, idle_s=0)
        assert first, "the joiner committed nothing before the kill"
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = fed["chunks"]
        proc.wait(30)
        proc = start_joiner(tmp_path, kafka_bootstrap, out_t, *args, name="joiner-restarted")
        # it fenced its killed self (aborting the open transaction) before it joined the group
        _wait_assigned(tmp_path / "joiner-restarted.log", proc)
        feeder.join()
        # what the topic holds, each read by a reader started anew: noida-db leaves a read_committed
        # consumer that was fetching across the aborted transaction short of later commits
        deadline = time.monotonic() + 180
        while len(msgs := read_topic(kafka_bootstrap, out_t, len(imps), timeout_s=15, idle_s=3)) < len(imps):
            assert time.monotonic() < deadline, f"{len(msgs)} of {len(imps)} samples committed"
    finally:
        if feeder.is_alive():
            feeder.join()
        code = _stop(proc)
    assert killed_at < chunks - 2, killed_at  # input kept arriving: the restart read what the first never saw
    log = (tmp_path / "joiner-restarted.log").read_text()
    assert code == 0, log[-3000:]
    assert "restored from" in log  # the state came back from the changelog, not from scratch
    decoded = decode_samples([m.value() for m in msgs], SPEC)
    counts = Counter(r["sample_id"] for r in decoded.table.to_pylist())
    assert [k for k, n in counts.items() if n > 1] == []
    assert_same_samples(decoded.table.to_pylist(), batch_samples(SPEC, imps, labels).to_pylist())


def _wait_assigned(log: Path, proc, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    """Until the joiner holds its partitions (its log says so)."""
    deadline = time.monotonic() + timeout_s
    while "assigned" not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the joiner did not start"
        time.sleep(0.1)


def test_two_replicas_share_the_partitions_and_make_each_sample_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    imp_t, clk_t, out_t = "imp-two", "clk-two", "samples-two"
    imps, clicks, labels = make_events(3000, seed=13)
    produce_raw(kafka_bootstrap, imps, clicks, imp_t, clk_t)
    args = ("--impressions-topic", imp_t, "--clicks-topic", clk_t, "--group", "two", "--idle-flush-s", "6")
    first = start_joiner(tmp_path, kafka_bootstrap, out_t, *args, "--instance", "a", name="a")
    second = None
    try:
        assert read_topic(kafka_bootstrap, out_t, 1, timeout_s=60, idle_s=0)
        # a second replica joins mid-stream: the group rebalances, the first commits and hands over
        second = start_joiner(tmp_path, kafka_bootstrap, out_t, *args, "--instance", "b", name="b")
        msgs = read_topic(kafka_bootstrap, out_t, len(imps), timeout_s=120, idle_s=8)
    finally:
        codes = [_stop(p) for p in (first, second) if p is not None]
    assert codes == [0, 0]
    # the second replica took over partitions, with the state the first one committed for them
    assert "restored from" in (tmp_path / "b.log").read_text()
    decoded = decode_samples([m.value() for m in msgs], SPEC).table.to_pylist()
    assert [k for k, n in Counter(r["sample_id"] for r in decoded).items() if n > 1] == []
    assert_same_samples(decoded, batch_samples(SPEC, imps, labels).to_pylist())


def test_side_tables_come_from_their_topic_newest_row_per_key(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A spec with a `users` side table: the joiner reads the `users` topic whole before joining
    (the newest row of a key wins; a bad row is skipped and counted) and the samples equal the
    batch path's with the same table."""
    import yaml
    from confluent_kafka import Producer

    from slipstream.samples.schema import source_arrow_schema
    from slipstream.stream.kafka import create_topic

    doc = yaml.safe_load((REPO_SPECS / "synthetic.yaml").read_text())
    doc["name"] = "synthetic-users"
    doc["sources"]["users"] = {"kind": "table", "key": "user_id", "fields": {
        "user_id": {"type": "long"}, "segment": {"type": "string", "optional": True, "default": "none"},
        "score": {"type": "double", "optional": True, "default": 0.0}}}
    doc["features"]["user_segment"] = {"kind": "categorical", "field": "users.segment", "buckets": 101}
    doc["features"]["user_score"] = {"kind": "dense", "field": "users.score", "clip": [0, 1], "scale": 1}
    spec_path = tmp_path / "synthetic-users.yaml"
    spec_path.write_text(yaml.safe_dump(doc))
    spec = load_spec(str(spec_path))

    rows = [{"user_id": u, "segment": f"seg-{u % 3}", "score": u / 40} for u in range(30)]  # users 30+ have none
    create_topic(kafka_bootstrap, "users", 1)
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce("users", key=b"5", value=json.dumps({"user_id": 5, "segment": "old", "score": 0.9}).encode())
    p.produce("users", key=b"7", value=b"{not json")
    for r in rows:
        p.produce("users", key=str(r["user_id"]).encode(), value=json.dumps(r).encode())
    p.flush(10)

    imp_t, clk_t, out_t = "imp-side", "clk-side", "samples-side"
    imps, clicks, labels = make_events(1500, seed=14)
    produce_raw(kafka_bootstrap, imps, clicks, imp_t, clk_t)
    proc = start_joiner(tmp_path, kafka_bootstrap, out_t, "--spec", str(spec_path), "--impressions-topic", imp_t,
                        "--clicks-topic", clk_t, "--group", "side")
    try:
        msgs = read_topic(kafka_bootstrap, out_t, len(imps), timeout_s=120)
    finally:
        assert _stop(proc) == 0, (tmp_path / "joiner.log").read_text()[-3000:]
    log = (tmp_path / "joiner.log").read_text()
    assert "side tables loaded: {'users': 30}" in log and "skipped users[0]@1" in log

    got = decode_samples([m.value() for m in msgs], spec).table.to_pylist()
    users = pa.Table.from_pylist(rows, schema=source_arrow_schema(spec.source("users")))
    assert_same_samples(got, batch_samples(spec, imps, labels, {"users": users}).to_pylist())
    scores = {r["user_id"]: r["user_score"] for r in got}
    assert scores[5] == pytest.approx(5 / 40) and scores[35] == 0.0  # the newest row; no row: the default
