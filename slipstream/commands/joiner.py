"""`slipstream joiner run --spec S`: the real-time sample joiner (raw impressions + clicks on Kafka
-> labelled, featurised samples on the sample topic), until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from slipstream.commands import dataset_settings
from slipstream.samples.spec import load_spec


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("joiner", help="the real-time sample joiner (docs/joiner.md)")
    jsub = p.add_subparsers(dest="joiner_command", required=True)
    r = jsub.add_parser("run", help="join raw impression and click topics into the sample topic, until SIGTERM")
    r.add_argument("--spec", help="feature spec: a shipped name or a YAML path (default: SLIPSTREAM_SPEC)")
    r.add_argument("--impressions-topic", help="raw events topic (default: the spec's events source name)")
    r.add_argument("--clicks-topic", help="raw clicks topic (default: the spec's click source name)")
    r.add_argument("--samples-topic", help="output topic (default: SLIPSTREAM_TOPIC)")
    r.add_argument("--group", help="consumer group shared by all replicas (default: slipstream-joiner-<spec>)")
    r.add_argument("--instance", help="this replica's stable name (default: the host name)")
    r.add_argument("--lateness-s", type=float, help="how late an event may arrive (default 120)")
    r.add_argument("--max-future-s", type=float, help="event times further ahead of the clock are dead letters (default 3600)")
    r.add_argument("--max-age-s", type=float,
                   help="event times further behind the clock are dead letters (default 34560000, 400 days; 0: no limit)")
    r.add_argument("--commit-interval-s", type=float, help="seconds between transactions (default 0.25)")
    r.add_argument("--idle-flush-s", type=float,
                   help="close every window after this many idle seconds at the inputs' end (replays; default 0: live)")
    r.add_argument("--health-port", type=int, help="serve /health and /metrics on 127.0.0.1:PORT")
    r.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from slipstream.joiner.config import JoinerConfig
    from slipstream.joiner.service import Joiner
    from slipstream.stream.kafka import KafkaAccess

    settings = dataset_settings(args.spec)
    spec = load_spec(settings.spec)
    cfg = JoinerConfig.for_spec(
        spec, args.samples_topic or settings.topic, impressions_topic=args.impressions_topic,
        clicks_topic=args.clicks_topic, group=args.group, instance=args.instance, lateness_s=args.lateness_s,
        max_future_s=args.max_future_s, max_age_s=args.max_age_s, commit_interval_s=args.commit_interval_s,
        idle_flush_s=args.idle_flush_s,
        health_port=args.health_port, codec=settings.kafka_codec, partitions=settings.topic_partitions,
    )
    joiner = Joiner(cfg, spec, KafkaAccess.from_settings(settings))

    def graceful(signum: int, frame: object) -> None:
        joiner.stop.set()  # the loop commits its open transaction and leaves the group

    signal.signal(signal.SIGTERM, graceful)
    signal.signal(signal.SIGINT, graceful)
    joiner.run()
    print(json.dumps(joiner.metrics.snapshot()), file=sys.stderr)
    return 0
