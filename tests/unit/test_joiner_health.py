"""The joiner's /health and /metrics endpoints (no broker: the metrics object alone)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from slipstream.dev.stack import free_port
from slipstream.joiner.metrics import JoinerMetrics, serve_health


def test_health_turns_503_when_work_waits_too_long_for_a_commit_and_metrics_are_prometheus_text() -> None:
    metrics = JoinerMetrics()
    metrics.counts["samples"] = 7
    metrics.dead("late click: impression x's window closed")
    port = free_port()
    server = serve_health(metrics, port, stale_s=0.5)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            body = json.loads(r.read())
        assert (body["samples"], body["late_clicks"], body["healthy"]) == (7, 1, True)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "slipstream_joiner_samples 7" in text
        assert 'slipstream_joiner_dead_letters_by_reason{reason="late click"} 1' in text
        metrics.last_commit = time.monotonic() - 1.0
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            raise AssertionError("a stale joiner answered 200")
        except urllib.error.HTTPError as e:
            assert e.code == 503
    finally:
        server.shutdown()
