"""What a running joiner reports: counters, lag, state size, latency; a log line now and then and,
when asked, /health and /metrics (Prometheus text) on 127.0.0.1."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

COUNTERS = ("impressions", "clicks", "samples", "samples_committed", "positives", "dead_letters", "late_clicks",
            "clicks_outside_window", "transactions", "restored_records", "side_table_rows", "side_table_skipped")


@dataclass
class JoinerMetrics:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    reasons: dict[str, int] = field(default_factory=dict)
    """Dead letters per kind of reason (the reason's text up to its first colon)."""
    lag: int = 0
    state_entries: int = 0
    watermark_us: int = 0
    started: float = field(default_factory=time.monotonic)
    last_commit: float = field(default_factory=time.monotonic)
    latencies_s: list[float] = field(default_factory=list)
    """Window close (event time) to transaction commit (wall clock), per sample; the last 100k."""
    healthy: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def dead(self, reason: str) -> None:
        kind = reason.split(":", 1)[0]
        with self.lock:
            self.counts["dead_letters"] += 1
            self.reasons[kind] = self.reasons.get(kind, 0) + 1
            if kind == "late click":
                self.counts["late_clicks"] += 1

    def add_latencies(self, values: np.ndarray) -> None:
        with self.lock:
            self.latencies_s.extend(values.tolist())
            if len(self.latencies_s) > 200_000:
                del self.latencies_s[:-100_000]

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            lat = np.asarray(self.latencies_s[-10_000:])
            return {**self.counts, "dead_letter_reasons": dict(self.reasons), "lag": self.lag,
                    "state_entries": self.state_entries, "watermark_us": self.watermark_us,
                    "seconds_since_commit": round(time.monotonic() - self.last_commit, 3),
                    "latency_p50_s": float(np.percentile(lat, 50)) if len(lat) else None,
                    "latency_p99_s": float(np.percentile(lat, 99)) if len(lat) else None,
                    "uptime_s": round(time.monotonic() - self.started, 1), "healthy": self.healthy}

    def prometheus(self) -> str:
        snap = self.snapshot()
        lines = []
        for name in (*COUNTERS, "lag", "state_entries", "seconds_since_commit"):
            kind = "counter" if name in COUNTERS else "gauge"
            lines += [f"# TYPE slipstream_joiner_{name} {kind}", f"slipstream_joiner_{name} {snap[name]}"]
        for reason, n in snap["dead_letter_reasons"].items():
            lines.append(f'slipstream_joiner_dead_letters_by_reason{{reason="{reason}"}} {n}')
        return "\n".join(lines) + "\n"


def serve_health(metrics: JoinerMetrics, port: int, stale_s: float = 60.0) -> ThreadingHTTPServer:
    """/health: 200 while the joiner keeps up (503 when work waited `stale_s` for a commit, or the loop
    failed; an idle joiner with nothing to commit is healthy);
    /metrics: Prometheus text. Runs in a daemon thread on 127.0.0.1."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.startswith("/metrics"):
                body, code, ctype = metrics.prometheus().encode(), 200, "text/plain; version=0.0.4"
            else:
                snap = metrics.snapshot()
                ok = snap["healthy"] and snap["seconds_since_commit"] < stale_s
                body, code, ctype = json.dumps(snap).encode(), 200 if ok else 503, "application/json"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="joiner-health", daemon=True).start()
    log.info("joiner health on http://127.0.0.1:%d/health and /metrics", port)
    return server
