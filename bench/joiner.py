"""`slipstream bench joiner --json`: the sample joiner's samples/s against raw consumption of the
same input topics, and its latency from window close to commit at a fixed input rate.

On a noida-db broker started on a free 127.0.0.1 port for this run (stopped by its PID after):

Throughput: `--impressions` N raw impressions over 24 h of event time (synthetic spec, 10% of them
clicked within the window) on two 4-partition topics, produced before anything reads them.
- `raw`: a plain confluent-kafka `Consumer` subscribed to both topics reads every record (values
  taken, nothing parsed): the ceiling.
- `joiner`: `slipstream.joiner.service.Joiner` (the service `slipstream joiner run` starts: parse,
  window join, Arrow featurizer, sample encoding, transactional produce with changelog and offsets)
  from a fresh group until every sample is committed (`--idle-flush-s` 0.05 closes the last
  windows once the input is read).
- `raw produce`: the joiner's committed samples read back, then produced again (same values, keys,
  timestamps) to another topic by a plain transactional producer committing as often as the
  joiner: the output's own cost on this broker.
`vs_raw` = joiner input records/s / raw input records/s (the same records), both timed from the
first record read, so the joiner's start-up (topics, transactions, group join: `joiner_startup_s`)
is not in it; `samples_per_s` = samples committed per second (one per impression).
`consume_then_produce_vs_raw` = raw read time / (raw read + raw produce time): the `vs_raw` of a
joiner that did nothing but read its input and write its output one after the other.

Latency: a separate producer process writes live events (time = the wall clock) at `--rate`
impressions/s for `--seconds`, each click at its own time (within a `--window-s` attribution
window); a fresh joiner (lateness `--lateness-s`) tails them. Latency = wall clock when the
sample's transaction committed - its window's close (impression time + window), so the watermark's
lateness, the commit interval and the work all count.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, Producer

from slipstream.dev.stack import free_port, start_kafka
from slipstream.joiner.config import JoinerConfig
from slipstream.joiner.raw_topics import event_value, produce_events, raw_producer
from slipstream.joiner.service import Joiner
from slipstream.processes import stop_process
from slipstream.samples.spec import load_spec, spec_from_dict
from slipstream.settings import KAFKA_CODECS as CODECS
from slipstream.stream.kafka import client_config, consumer_config, create_topic

log = logging.getLogger("bench.joiner")
US = 1_000_000
DEVICES, COUNTRIES, CATS = ("ios", "android", "web"), ("us", "de", "fr", "jp"), tuple(f"cat{i}" for i in range(12))


def _impression(rng: np.random.Generator, i: int, ts: int, users: int) -> dict[str, Any]:
    return {"impression_id": f"b{i}", "ts": ts, "user_id": int(rng.integers(0, users)),
            "item_id": int(rng.integers(0, 5000)), "device": DEVICES[i % 3], "country": COUNTRIES[i % 4],
            "item_category": CATS[i % 12], "price": float(rng.uniform(0, 100)), "position": i % 20,
            "item_age_days": float(rng.uniform(0, 50)), "user_tenure_days": float(rng.uniform(0, 900))}


def _history(n: int, window_s: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rng = np.random.default_rng(5)
    start = int(time.time() - 3 * 86400) * US
    ts = np.sort(start + rng.integers(0, 86400 * US, n))
    imps = [_impression(rng, i, int(t), 20_000) for i, t in enumerate(ts)]
    clicks = [{"impression_id": r["impression_id"], "ts": r["ts"] + int(rng.uniform(0, window_s) * US), "_u": r["user_id"]}
              for r in imps if rng.random() < 0.1]
    clicks.sort(key=lambda c: c["ts"])
    return imps, clicks


def _produce(bootstrap: str, imp_t: str, clk_t: str, imps: list[dict[str, Any]], clicks: list[dict[str, Any]]) -> None:
    produce_events(bootstrap, imp_t, imps, [r["user_id"] for r in imps], "ts")
    produce_events(bootstrap, clk_t, [{k: v for k, v in c.items() if k != "_u"} for c in clicks],
                   [c["_u"] for c in clicks], "ts")


def _raw_read(bootstrap: str, topics: list[str], expected: int) -> float:
    c = Consumer(consumer_config(bootstrap, group=f"bench-raw-{time.monotonic_ns()}"))
    c.subscribe(topics)
    n, t0 = 0, None
    try:
        while n < expected:
            for m in c.consume(10_000, timeout=1.0):
                if m.error() is None:
                    t0 = t0 or time.perf_counter()
                    m.value()
                    n += 1
        return time.perf_counter() - (t0 or time.perf_counter())
    finally:
        c.close()


def _raw_produce(bootstrap: str, source: str, topic: str, expected: int, interval_s: float) -> float:
    """Read `source` (the joiner's committed samples), then produce the same values, keys and
    timestamps to `topic` the way the joiner does (idempotent, lz4, a transaction every
    `interval_s`); returns the seconds of the produce, first record to last commit."""
    c = Consumer(consumer_config(bootstrap, group=f"bench-copy-{time.monotonic_ns()}"))
    c.subscribe([source])
    records: list[tuple[bytes | None, bytes | None, int]] = []
    deadline = time.monotonic() + 120
    try:
        while len(records) < expected and time.monotonic() < deadline:
            records += [(m.value(), m.key(), m.timestamp()[1]) for m in c.consume(10_000, timeout=1.0) if m.error() is None]
    finally:
        c.close()
    producer = Producer(client_config(bootstrap, **{
        "transactional.id": f"bench-raw-produce-{time.monotonic_ns()}", "enable.idempotence": True, "linger.ms": 5,
        "compression.type": "lz4"}))
    producer.init_transactions(60)
    t0 = time.perf_counter()
    producer.begin_transaction()
    started = time.monotonic()
    for value, key, ts in records:
        while True:
            try:
                producer.produce(topic, value=value, key=key, timestamp=ts)
                break
            except BufferError:
                producer.poll(0.05)
        if time.monotonic() - started >= interval_s:
            producer.commit_transaction(60)
            producer.begin_transaction()
            started = time.monotonic()
    producer.commit_transaction(60)
    return time.perf_counter() - t0


def _run_joiner(cfg: JoinerConfig, spec: Any, bootstrap: str, until: Any, timeout_s: float) -> tuple[Joiner, float, float]:
    """Run a joiner until `until(joiner)`; returns it, the seconds from its first record taken to
    then (the raw consumer's basis), and its start-up (group join, topics, transactions)."""
    joiner = Joiner(cfg, spec, bootstrap)
    thread = threading.Thread(target=joiner.run, daemon=True)
    t0 = time.perf_counter()
    first = None
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not until(joiner) and time.monotonic() < deadline:
        if first is None and joiner.positions:
            first = time.perf_counter()
        time.sleep(0.01)
    took = time.perf_counter()
    joiner.stop.set()
    thread.join(60)
    first = first or t0
    return joiner, took - first, first - t0


def _profile(spec: Any, impressions: int, codec: str) -> dict[str, Any]:
    """The joiner alone on a fixed input, run in this thread under cProfile until every sample is
    committed: CPU time moves less with the machine's load than wall time."""
    import cProfile
    import pstats
    import sys

    with tempfile.TemporaryDirectory(prefix="bench-joiner-") as tmp:
        svc = start_kafka(Path(tmp), free_port())
        try:
            for t in ("imp", "clk"):
                create_topic(svc.address, t, 4)
            imps, clicks = _history(impressions, spec.label.window_s)
            _produce(svc.address, "imp", "clk", imps, clicks)
            cfg = JoinerConfig.for_spec(spec, "samples", impressions_topic="imp", clicks_topic="clk", group="bench-p",
                                        instance="bench", idle_flush_s=0.05, input_idle_s=0.05, codec=codec)
            joiner = Joiner(cfg, spec, svc.address)

            def stop_when_done() -> None:
                while joiner.metrics.counts["samples_committed"] < len(imps):
                    time.sleep(0.01)
                joiner.stop.set()

            threading.Thread(target=stop_when_done, daemon=True).start()
            prof = cProfile.Profile()
            wall, cpu = time.perf_counter(), time.process_time()
            prof.runcall(joiner.run)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        finally:
            stop_process(svc.pid)
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return {"profile_wall_s": round(wall, 2), "profile_cpu_s": round(cpu, 2), "impressions": len(imps),
            "clicks": len(clicks), "codec": codec, "cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)}


def _live_producer(bootstrap: str, imp_t: str, clk_t: str, rate: float, seconds: float, window_s: float) -> None:
    rng = np.random.default_rng(9)
    producer = raw_producer(bootstrap)
    due: list[tuple[int, dict[str, Any], int]] = []
    t_end, i, started = time.time() + seconds, 0, time.time()
    while time.time() < t_end:
        now = time.time()
        target = int((now - started) * rate)
        while i < target:
            r = _impression(rng, i, int(time.time() * US), 5000)
            producer.produce(imp_t, value=event_value(r, "ts"), key=str(r["user_id"]).encode(), timestamp=r["ts"] // 1000)
            if rng.random() < 0.1:
                due.append((r["ts"] + int(rng.uniform(0, window_s) * US), r, r["user_id"]))
            i += 1
        now_us = int(time.time() * US)
        ready = [d for d in due if d[0] <= now_us]
        due = [d for d in due if d[0] > now_us]
        for t, r, u in ready:
            c = {"impression_id": r["impression_id"], "ts": t}
            producer.produce(clk_t, value=event_value(c, "ts"), key=str(u).encode(), timestamp=t // 1000)
        producer.poll(0)
        time.sleep(0.005)
    producer.flush(30)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="slipstream bench joiner")
    ap.add_argument("--impressions", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=2000.0, help="impressions/s in the latency run")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--window-s", type=int, default=2, help="attribution window of the latency run")
    ap.add_argument("--lateness-s", type=float, default=0.2)
    ap.add_argument("--codec", choices=CODECS, default="json", help="sample value format (SLIPSTREAM_KAFKA_CODEC)")
    ap.add_argument("--profile", action="store_true",
                    help="only the joiner on the throughput input, under cProfile: wall and CPU seconds (start-up "
                         "included), the top functions on stderr")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    spec = load_spec("synthetic")
    if args.profile:
        return _profile(spec, args.impressions, args.codec)
    with tempfile.TemporaryDirectory(prefix="bench-joiner-") as tmp:
        svc = start_kafka(Path(tmp), free_port())
        bs = svc.address
        try:
            for t in ("imp", "clk", "imp-live", "clk-live"):
                create_topic(bs, t, 4)
            imps, clicks = _history(args.impressions, spec.label.window_s)
            _produce(bs, "imp", "clk", imps, clicks)
            records = len(imps) + len(clicks)
            raw_s = _raw_read(bs, ["imp", "clk"], records)
            cfg = JoinerConfig.for_spec(spec, "samples", impressions_topic="imp", clicks_topic="clk", group="bench-j",
                                        instance="bench", idle_flush_s=0.05, input_idle_s=0.05,
                                        codec=args.codec)
            joiner, joiner_s, startup_s = _run_joiner(
                cfg, spec, bs, lambda j: j.metrics.counts["samples_committed"] >= len(imps), 600)
            assert joiner.metrics.counts["samples_committed"] == len(imps), joiner.metrics.snapshot()
            create_topic(bs, "samples-copy", 4)
            produce_s = _raw_produce(bs, "samples", "samples-copy", len(imps), cfg.commit_interval_s)

            doc = spec.to_dict()
            doc["label"] = {"click_within": {"source": "clicks", "window_s": args.window_s}}
            live_spec = spec_from_dict(doc)
            live_cfg = JoinerConfig.for_spec(live_spec, "samples-live", impressions_topic="imp-live", clicks_topic="clk-live",
                                             group="bench-live", instance="bench", lateness_s=args.lateness_s,
                                             input_idle_s=0.05, idle_flush_s=0.0, codec=args.codec)
            producer = mp.get_context("spawn").Process(target=_live_producer, args=(
                bs, "imp-live", "clk-live", args.rate, args.seconds, args.window_s))
            producer.start()
            live, _, _ = _run_joiner(live_cfg, live_spec, bs, lambda j: not producer.is_alive() and
                                  time.monotonic() - j.metrics.last_commit < 1 and j.metrics.counts["samples"] > 0,
                                  args.seconds + 120)
            producer.join(30)
            lat = np.asarray(live.metrics.latencies_s)
        finally:
            stop_process(svc.pid)
    raw_rps = records / raw_s
    joiner_rps = records / joiner_s
    return {
        "samples_per_s": round(len(imps) / joiner_s, 1), "vs_raw": round(joiner_rps / raw_rps, 3),
        "joiner_input_records_per_s": round(joiner_rps, 1), "raw_input_records_per_s": round(raw_rps, 1),
        "raw_produce_records_per_s": round(len(imps) / produce_s, 1),
        "consume_then_produce_vs_raw": round(raw_s / (raw_s + produce_s), 3), "joiner_startup_s": round(startup_s, 2),
        "impressions": len(imps), "clicks": len(clicks), "p50_s": round(float(np.percentile(lat, 50)), 3),
        "p99_s": round(float(np.percentile(lat, 99)), 3), "latency_samples": int(len(lat)), "rate": args.rate,
        "seconds": args.seconds, "window_s": args.window_s, "lateness_s": args.lateness_s,
        "commit_interval_s": live_cfg.commit_interval_s, "codec": args.codec, "partitions": 4, "cpus": os.cpu_count(),
        "load_1m": round(os.getloadavg()[0], 2),
    }
