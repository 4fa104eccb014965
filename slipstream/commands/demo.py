"""`slipstream demo`: run the whole pipeline once on the embedded stack and print a summary."""

from __future__ import annotations

import argparse
import json
import math
from datetime import UTC, date, datetime, timedelta

from slipstream.dev.demo import DemoOptions, format_summary, run_demo
from slipstream.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="stack up, generate data, run daily_retrain once, print a summary, stack down")
    p.add_argument("--days", type=int, default=DemoOptions.days, help="days of raw logs (the training window)")
    p.add_argument("--impressions-per-day", type=int, default=DemoOptions.impressions_per_day)
    p.add_argument("--stream-minutes", type=float, default=DemoOptions.stream_minutes,
                   help="event time the Kafka stream covers after the last day")
    p.add_argument("--epochs", type=int, default=DemoOptions.epochs)
    p.add_argument("--batch-size", type=int, help="samples per step per training process (default: the DAG's)")
    p.add_argument("--lr", type=float, help="learning rate (default: the DAG's)")
    p.add_argument("--spec", help="feature spec: a shipped name (synthetic, criteo, ratings) or a YAML path "
                                  "(default: SLIPSTREAM_SPEC); other specs than synthetic generate without drift")
    p.add_argument("--no-drift", action="store_true", help="keep the hidden model fixed after T")
    p.add_argument("--keep-running", action="store_true", help="leave the stack up afterwards")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--profile", choices=("local", "cluster"), default="local",
                   help="cluster: run on a Spark cluster, the Iceberg REST catalog and S3 (docs/cluster.md)")
    p.set_defaults(func=run)


def first_day(days: int, today: date, stream_minutes: float = 0.0) -> date:
    """The demo's first raw day: its usual one, or earlier when `days` and then the stream after
    them would reach past yesterday (a day that is not over cannot be trained on, and the stream's
    events, which follow the last day, are not in the future)."""
    return min(DemoOptions.start_day, today - timedelta(days=days + 1 + math.ceil(stream_minutes / 1440)))


def run(args: argparse.Namespace) -> int:
    opts = DemoOptions(start_day=first_day(args.days, datetime.now(UTC).date(), args.stream_minutes),
                       days=args.days, impressions_per_day=args.impressions_per_day,
                       stream_minutes=args.stream_minutes, epochs=args.epochs,
                       batch_size=args.batch_size, lr=args.lr,
                       drift=not args.no_drift, keep_running=args.keep_running, spec=args.spec,
                       profile=args.profile)
    summary = run_demo(Settings.from_env(), opts)
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0
