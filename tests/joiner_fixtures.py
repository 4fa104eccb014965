"""Raw impressions and clicks for the joiner's tests, and the samples the batch path makes of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from slipstream.samples.schema import source_arrow_schema
from slipstream.samples.spec import LABEL, SAMPLE_ID, Spec
from slipstream.samples.transform import Featurizer

REPO = Path(__file__).resolve().parents[1]
US = 1_000_000
START_US = 1_793_491_200 * US  # 2026-11-01T00:00:00Z
DEVICES, COUNTRIES, CATS = ("ios", "android", "web"), ("us", "de", "fr", "jp"), ("cat0", "cat1", "cat2", "cat3")


def make_events(n: int, users: int = 40, seed: int = 3, span_s: float = 7200.0, window_s: int = 1800,
                click_rate: float = 0.3) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    """`n` impressions over `span_s` seconds (time order, a little shuffled) and their clicks; some
    clicks come after the window (not a label). Returns impressions, clicks, expected label per id."""
    rng = np.random.default_rng(seed)
    ts = np.sort(START_US + rng.integers(0, int(span_s * US), n))
    imps, clicks, labels = [], [], {}
    for i in range(n):
        sid = f"imp-{seed}-{i:07d}"
        imps.append({"impression_id": sid, "ts": int(ts[i]), "user_id": int(rng.integers(0, users)),
                     "item_id": int(rng.integers(0, 300)), "device": DEVICES[i % 3], "country": COUNTRIES[i % 4],
                     "item_category": CATS[int(rng.integers(0, 4))], "price": float(rng.uniform(0, 100)),
                     "position": int(rng.integers(0, 20)), "item_age_days": float(rng.uniform(0, 50)),
                     "user_tenure_days": float(rng.uniform(0, 900))})
        labels[sid] = 0
        if rng.random() < click_rate:
            delay = float(rng.uniform(0, window_s * 1.3))
            clicks.append({"impression_id": sid, "ts": int(ts[i] + delay * US), "_user": imps[-1]["user_id"]})
            labels[sid] = int(delay * US <= window_s * US)
    clicks.sort(key=lambda c: c["ts"])
    return imps, clicks, labels


def batch_samples(spec: Spec, imps: list[dict[str, Any]], labels: dict[str, int],
                  tables: dict[str, pa.Table] | None = None) -> pa.Table:
    """What the batch path makes of the same impressions (and side `tables`): one sorted pass of
    the shared featurizer."""
    rows = sorted(imps, key=lambda r: (r["user_id"], r["ts"], r["impression_id"]))
    table = pa.Table.from_pylist(rows, schema=source_arrow_schema(spec.events))
    table = table.append_column(SAMPLE_ID, pa.array([r["impression_id"] for r in rows], pa.string()))
    table = table.append_column(LABEL, pa.array([labels[r["impression_id"]] for r in rows], pa.int32()))
    return Featurizer(spec, tables).samples(table)


def produce_raw(bootstrap: str, imps: list[dict[str, Any]], clicks: list[dict[str, Any]],
                imp_topic: str = "impressions", click_topic: str = "clicks", producer: Any = None) -> None:
    """Impressions and clicks on their topics, both keyed by user (co-partitioned). Without a
    `producer` the topics are created first (4 partitions)."""
    from slipstream.joiner.raw_topics import produce_events
    from slipstream.stream.kafka import create_topic

    if producer is None:
        for topic in (imp_topic, click_topic):
            create_topic(bootstrap, topic, 4)
    produce_events(bootstrap, imp_topic, imps, [r["user_id"] for r in imps], "ts", producer=producer)
    produce_events(bootstrap, click_topic, [{k: v for k, v in c.items() if k != "_user"} for c in clicks],
                   [c["_user"] for c in clicks], "ts", producer=producer)


def start_joiner(home: Path, bootstrap: str, samples_topic: str, *extra: str, name: str = "joiner") -> subprocess.Popen:
    env = {**os.environ, "SLIPSTREAM_HOME": str(home), "SLIPSTREAM_KAFKA_BOOTSTRAP": bootstrap,
           "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}"}
    log = open(home / f"{name}.log", "ab")
    instance = () if "--instance" in extra else ("--instance", "test")
    flush = () if "--idle-flush-s" in extra else ("--idle-flush-s", "1")
    return subprocess.Popen([sys.executable, "-m", "slipstream.cli", "joiner", "run", "--spec", "synthetic",
                             "--samples-topic", samples_topic, *instance, *flush, "--commit-interval-s", "0.2", *extra],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)


def read_topic(bootstrap: str, topic: str, expect: int, timeout_s: float = 120.0, idle_s: float = 3.0) -> list[Any]:
    """Every committed record of `topic` (read_committed) once `expect` arrived and `idle_s` passed
    without more (to catch duplicates), or at the timeout."""
    from confluent_kafka import Consumer, TopicPartition

    from slipstream.stream.kafka import consumer_config, create_topic

    create_topic(bootstrap, topic, 4)
    c = Consumer(consumer_config(bootstrap, group=f"reader-{time.monotonic_ns()}"))
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[Any] = []
    deadline, last_new = time.monotonic() + timeout_s, time.monotonic()
    try:
        while time.monotonic() < deadline:
            msgs = [m for m in c.consume(5000, timeout=0.5) if m.error() is None]
            if msgs:
                out += msgs
                last_new = time.monotonic()
            elif len(out) >= expect and time.monotonic() - last_new >= idle_s:
                break
    finally:
        c.close()
    return out


def headers_of(msg: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in (msg.headers() or [])}


def dump(obj: Any) -> str:
    return json.dumps(obj, default=str)[:2000]


def write_raw_zone(raw: Path, imps: list[dict[str, Any]], clicks: list[dict[str, Any]]) -> None:
    """The same events as raw-zone files (JSON lines per source/day/hour), what the Spark job reads."""
    import gzip
    from collections import defaultdict

    from slipstream.joiner.raw_topics import iso_us

    parts: dict[Path, list[dict[str, Any]]] = defaultdict(list)
    for source, rows in (("impressions", imps), ("clicks", clicks)):
        for r in rows:
            when = iso_us(r["ts"])
            row = {k: v for k, v in r.items() if not k.startswith("_")}
            row["ts"] = when
            parts[raw / source / f"day={when[:10]}" / f"hour={when[11:13]}" / "part-0.jsonl.gz"].append(row)
    for path, rows in parts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wb") as fh:
            fh.writelines(json.dumps(r).encode() + b"\n" for r in rows)
