"""`slipstream import --stream-after T`: the events at or after T go to a real broker as samples
(keyed by user, timestamped with the event time, labelled by the clicks of the same import, with
the user's earlier events of the day in the sequence), and every event to the raw zone: a run
whose T is later than the import's trains the streamed ones from the table, and the audit, reading
the stream from the window's start, finds none lost (it counts a streamed row the table lacks)."""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, TopicPartition

from slipstream.cli import main
from slipstream.samples.codec import decode_samples
from slipstream.stream.kafka import consumer_config, end_offsets

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data" / "import" / "synthetic"


def test_stream_after_produces_the_tail_as_samples(settings, kafka_bootstrap: str, topic: str,  # type: ignore[no-untyped-def]
                                                   monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLIPSTREAM_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("SLIPSTREAM_TOPIC", topic)
    rc = main(["import", "--json", "--stream-after", "2026-11-03T12:00:00Z", str(DATA / "impressions.jsonl"),
               str(DATA / "clicks.jsonl")])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stream"]["samples"] == out["stream"]["produced"] == 2 and out["sources"]["impressions"]["streamed"] == 2

    raw = Path(settings.raw_dir)
    kept = pq.read_table(raw / "impressions").column("impression_id").to_pylist()
    assert sorted(kept) == ["imp-1", "imp-2", "imp-3", "imp-5", "imp-6", "imp-7"]  # imp-4 rejected; 6 and 7 streamed too
    assert sorted(pq.read_table(raw / "clicks").column("impression_id").to_pylist()) == ["imp-1", "imp-5", "imp-6"]

    ends = end_offsets(kafka_bootstrap, topic)
    assert sum(ends.values()) == 2
    c = Consumer(consumer_config(kafka_bootstrap))
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    msgs = []
    while len(msgs) < 2:
        msgs += [m for m in c.consume(10, timeout=5) if m.error() is None]
    c.close()
    by_key = {m.key(): m for m in msgs}
    assert set(by_key) == {b"1", b"3"}  # keyed by user
    samples = {r["sample_id"]: r for r in decode_samples([m.value() for m in msgs]).table.to_pylist()}
    assert samples["imp-6"]["label"] == 1 and samples["imp-7"]["label"] == 0  # imp-6 clicked after 10 minutes
    assert samples["imp-7"]["hist_items"] == [10]  # user 3's earlier impression that day (imp-5, in the raw zone)
    assert samples["imp-6"]["hist_items"] == []
    assert by_key[b"1"].timestamp()[1] == 1793709000000  # 2026-11-03T12:30:00Z, the event time


def _consume(bootstrap: str, topic: str, n: int) -> list:  # type: ignore[type-arg]
    ends = end_offsets(bootstrap, topic)
    assert sum(ends.values()) == n
    c = Consumer(consumer_config(bootstrap))
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    msgs: list = []  # type: ignore[type-arg]
    while len(msgs) < n:
        msgs += [m for m in c.consume(1000, timeout=5) if m.error() is None]
    c.close()
    return msgs


def test_stream_after_for_the_ratings_layout_and_generate_for_criteo(settings, kafka_bootstrap: str, topic: str,  # type: ignore[no-untyped-def]
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from slipstream.samples.schema import hash_category
    from slipstream.samples.spec import load_spec

    monkeypatch.setenv("SLIPSTREAM_KAFKA_BOOTSTRAP", kafka_bootstrap)
    # ratings is a data set of its own: its topic is set by its own name, its raw zone is its own
    monkeypatch.setenv("SLIPSTREAM_DATASET__RATINGS__TOPIC", topic)
    d = DATA.parent / "ratings"
    assert main(["import", "--json", "--spec", "ratings", "--stream-after", "2026-11-04T00:00:00Z",
                 str(d / "ratings.csv"), str(d / "users.csv"), str(d / "items.csv")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stream"]["produced"] == 2 and out["stream"]["topic"] == topic
    ratings_raw = Path(settings.for_dataset("ratings").raw_dir)
    assert (ratings_raw / "ratings" / "day=2026-11-04").exists()  # streamed, and in the raw zone
    msgs = _consume(kafka_bootstrap, topic, 2)
    rows = decode_samples([m.value() for m in msgs], load_spec("ratings")).table.to_pylist()
    by_user = {r["user_id"]: r for r in rows}
    assert {m.key() for m in msgs} == {b"2", b"3"}
    assert (by_user[3]["label"], by_user[2]["label"]) == (0, 1)  # ratings 1 and 5
    assert by_user[3]["gender"] == hash_category("unknown") and by_user[2]["gender"] == hash_category("M")

    # criteo is a data set of its own: its topic is set by its own name (SLIPSTREAM_TOPIC is the default data set's)
    monkeypatch.setenv("SLIPSTREAM_DATASET__CRITEO__TOPIC", topic + "-criteo")
    assert main(["generate", "--spec", "criteo", "--days", "1", "--events-per-day", "2000", "--stream-minutes", "30"]) == 0
    out = json.loads(capsys.readouterr().out)
    msgs = _consume(kafka_bootstrap, topic + "-criteo", out["produced"])
    decoded = decode_samples([m.value() for m in msgs], load_spec("criteo"))
    assert out["produced"] == out["stream_samples"] > 0 and decoded.bad == [] and decoded.table.num_rows == out["produced"]


def test_a_run_whose_t_is_after_the_stream_start_loses_nothing(settings, kafka_bootstrap: str, topic: str,  # type: ignore[no-untyped-def]
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """--stream-after 2026-11-03T12:00, a run with T = 2026-11-04: the streamed rows before T are
    skipped by the stream phase; they must be in the run's window, and the audit checks that."""
    from datetime import datetime

    import pyarrow as pa
    import pyarrow.compute as pc

    from slipstream.quality.audit import audit_run, read_kafka_range, stream_audit_start
    from slipstream.samples.spec import load_spec

    monkeypatch.setenv("SLIPSTREAM_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("SLIPSTREAM_TOPIC", topic)
    files = [str(DATA / "impressions.jsonl"), str(DATA / "clicks.jsonl")]
    assert main(["import", "--stream-after", "2026-11-03T12:00:00Z", *files]) == 0
    capsys.readouterr()
    t_run, window_start = datetime(2026, 11, 4, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)
    ends = end_offsets(kafka_bootstrap, topic)
    handoff = dict(ends)  # nothing at or after the run's T: the stream phase starts at the end
    start = stream_audit_start(kafka_bootstrap, topic, window_start, handoff)
    assert start == {p: 0 for p in ends}  # read from the window's start, not from the handoff
    kafka = read_kafka_range(kafka_bootstrap, topic, start, ends, spec=load_spec())
    assert sorted(kafka.column("sample_id").to_pylist()) == ["imp-6", "imp-7"]

    events = pq.read_table(Path(settings.raw_dir) / "impressions")  # what preprocessing turns into the window
    window = events.filter(pc.less(events.column("ts"), pa.scalar(t_run, events.column("ts").type)))
    metrics = {"t_handoff": t_run.isoformat(), "window_start": window_start.isoformat()}
    empty = pa.table({"sample_id": pa.array([], pa.string()), "source": pa.array([], pa.string()),
                      "epoch": pa.array([], pa.int32()), "step": pa.array([], pa.int64())})
    res = audit_run(empty, window.column("impression_id"), window.column("ts"), metrics, kafka)
    before = next(s for s in res.sources if s.source == "kafka before T")
    assert (before.expected, before.lost) == (2, 0)
    # had the import kept the streamed rows out of the raw zone, both would be counted lost
    partial = window.filter(pc.invert(pc.is_in(window.column("impression_id"), pa.array(["imp-6", "imp-7"]))))
    res = audit_run(empty, partial.column("impression_id"), partial.column("ts"), metrics, kafka)
    assert next(s for s in res.sources if s.source == "kafka before T").lost == 2 and not res.exactly_once
