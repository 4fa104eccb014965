"""`slipstream import --stream-after T`: the events at or after T go to a real broker as samples
(keyed by user, timestamped with the event time, labelled by the clicks of the same import, with
the user's earlier events of the day in the sequence), and only the events before T to the raw zone."""

from __future__ import annotations

import json
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
    rc = main(["import", "--json", "--stream-after", "2026-11-03T12:00:00Z", str(DATA / "impressions.jsonl"), str(DATA / "clicks.jsonl")])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stream"]["samples"] == out["stream"]["produced"] == 2 and out["sources"]["impressions"]["streamed"] == 2

    raw = Path(settings.raw_dir)
    kept = pq.read_table(raw / "impressions").column("impression_id").to_pylist()
    assert sorted(kept) == ["imp-1", "imp-2", "imp-3", "imp-5"]  # imp-4 rejected, imp-6 and imp-7 streamed
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
    monkeypatch.setenv("SLIPSTREAM_TOPIC", topic)
    d = DATA.parent / "ratings"
    assert main(["import", "--json", "--spec", "ratings", "--stream-after", "2026-11-04T00:00:00Z",
                 str(d / "ratings.csv"), str(d / "users.csv"), str(d / "items.csv")]) == 0
    assert json.loads(capsys.readouterr().out)["stream"]["produced"] == 2
    assert not (Path(settings.raw_dir) / "ratings" / "day=2026-11-04").exists()
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
