"""`slipstream generate`: synthetic raw logs for N days and the labelled stream after them."""

from __future__ import annotations

import argparse
import json
import logging
from datetime import date

from slipstream.dev.datagen import GeneratorConfig, generate, write_manifest
from slipstream.settings import Settings

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate raw logs (impressions, clicks) and the Kafka sample stream")
    p.add_argument("--start-day", type=date.fromisoformat, default=date(2026, 11, 1), help="first day (UTC)")
    p.add_argument("--days", type=int, default=3)
    p.add_argument("--impressions-per-day", type=int, default=20_000)
    p.add_argument("--users", type=int, default=2_000)
    p.add_argument("--items", type=int, default=400)
    p.add_argument("--stream-minutes", type=float, default=60.0, help="event time covered by the stream after T")
    p.add_argument("--drift", action="store_true", help="change the hidden model at T (concept drift)")
    p.add_argument("--corrupt-fraction", type=float, default=0.0, help="share of bad raw lines")
    p.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-stream", action="store_true", help="write the raw zone only")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    cfg = GeneratorConfig(
        start_day=args.start_day, days=args.days, impressions_per_day=args.impressions_per_day,
        users=args.users, items=args.items, stream_minutes=args.stream_minutes, drift=args.drift,
        corrupt_fraction=args.corrupt_fraction, fmt=args.format, seed=args.seed,
    )
    data = generate(cfg, settings.raw_dir)
    manifest = write_manifest(data, settings.home / "generator" / "manifest.json")
    if not args.no_stream:
        from slipstream.stream.kafka import KafkaAccess, create_topic, produce_samples

        broker = KafkaAccess.from_settings(settings)
        create_topic(broker, settings.topic, settings.topic_partitions)
        n = produce_samples(broker, settings.topic, data.stream, codec=settings.kafka_codec)
        manifest["produced"] = n
        log.info("produced %d stream samples to %s on %s", n, settings.topic, broker)
    print(json.dumps(manifest, indent=2))
    return 0
