"""The demo's wait for the joiner ends (done, stalled, or at its deadline) and says what the joiner
dead-lettered and why, with examples from the dead-letter topics; impressions neither joined nor
dead-lettered stop the demo."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from confluent_kafka import Producer

from slipstream.dev import stack
from slipstream.dev.demo import wait_for_samples
from slipstream.dev.joiner_wait import wait_for_joiner
from slipstream.errors import SlipstreamError
from slipstream.samples.spec import load_spec
from slipstream.settings import Settings
from slipstream.stream.kafka import create_topic

pytestmark = pytest.mark.integration

LATE = "late impression: its window closed at 2026-11-04T00:20:08Z, the joiner's watermark is already 2026-11-04T06:07:25Z"


@pytest.fixture
def health() -> Iterator[tuple[str, dict[str, Any]]]:
    """A stand-in /health that serves whatever the test puts in the dict."""
    snap: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(snap).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/health", snap
    finally:
        server.shutdown()


def _dead_letters(bootstrap: str, topic: str, reasons: list[str]) -> None:
    create_topic(bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": bootstrap})
    for r in reasons:
        p.produce(topic, value=b"{}", headers=[("reason", r.encode())])
    assert p.flush(10) == 0


def test_a_stalled_joiner_is_reported_with_its_dead_letters_and_their_reasons(
        kafka_bootstrap: str, health: tuple[str, dict[str, Any]]) -> None:
    url, snap = health
    _dead_letters(kafka_bootstrap, "wait-imps.dlq", [LATE, LATE])
    _dead_letters(kafka_bootstrap, "wait-clicks.dlq", ["click without impression: no impression imp-9 arrived in time"])
    snap.update(samples_committed=3902, impressions=3902, dead_letters=2116, lag=0,
                dead_letter_reasons={"late impression": 1237, "click without impression": 879})
    out = wait_for_joiner(url, 5139, broker=kafka_bootstrap, dlq_topics=("wait-imps.dlq", "wait-clicks.dlq"),
                          deadline_s=30, stall_s=1.0)
    assert out.ended_by == "stalled" and out.waited_s < 10
    assert out.impressions_dead == 1237 and out.accounted
    text = out.explain()
    assert "committed 3,902 of 5,139 samples" in text and "late impression: 1,237, click without impression: 879" in text
    assert LATE in text and "click without impression: no impression imp-9" in text


def test_the_wait_ends_at_its_deadline_while_input_is_unread(health: tuple[str, dict[str, Any]]) -> None:
    url, snap = health
    snap.update(samples_committed=10, impressions=10, dead_letters=0, lag=500, dead_letter_reasons={})
    out = wait_for_joiner(url, 100, deadline_s=1.5, stall_s=0.5)
    assert out.ended_by == "deadline" and not out.accounted
    assert "committed 10 of 100 samples (deadline after" in out.explain()


def test_the_demo_stops_when_impressions_are_neither_samples_nor_dead_letters(
        settings: Settings, kafka_bootstrap: str, health: tuple[str, dict[str, Any]]) -> None:
    url, snap = health
    settings = dataclasses.replace(settings, kafka_bootstrap=kafka_bootstrap)
    joiner = stack.ServiceState("joiner", 0, url, "/tmp/joiner.log")
    # all 100 impressions taken, 60 samples committed, then nothing: 40 unaccounted
    snap.update(samples_committed=60, impressions=100, dead_letters=0, lag=0, dead_letter_reasons={})
    spec = load_spec("synthetic")
    with pytest.raises(SlipstreamError, match="40 impressions are neither samples nor dead letters; see the joiner's log"):
        wait_for_samples(settings, spec, joiner, 100, stall_s=0.5)
    snap.update(samples_committed=60, impressions=60, dead_letters=40, dead_letter_reasons={"late impression": 40})
    assert wait_for_samples(settings, spec, joiner, 100, stall_s=0.5).committed == 60  # accounted: trains on
