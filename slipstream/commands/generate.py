"""`slipstream generate`: synthetic raw logs for N days and the labelled stream after them.

The shipped synthetic spec uses its own generator (`slipstream.dev.datagen`, with `--drift`); any
other spec (`--spec criteo`, `--spec ratings`, `--spec my.yaml`, a changed synthetic spec) the
generic one (`slipstream.dev.specgen`).
"""

from __future__ import annotations

import argparse
import json
import logging
from datetime import date

from slipstream.commands import dataset_settings
from slipstream.dev.datagen import GeneratedData, GeneratorConfig, generate, generates, write_manifest
from slipstream.errors import ConfigError
from slipstream.samples.spec import Spec, load_spec
from slipstream.settings import Settings

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("generate", help="generate raw logs for a feature spec and the Kafka sample stream after them")
    p.add_argument("--spec",
                   help="feature spec: a shipped name (synthetic, criteo, ratings) or a YAML path (default: SLIPSTREAM_SPEC)")
    p.add_argument("--start-day", type=date.fromisoformat, default=date(2026, 11, 1), help="first day (UTC)")
    p.add_argument("--days", type=int, default=3)
    p.add_argument("--impressions-per-day", "--events-per-day", dest="events_per_day", type=int, default=20_000)
    p.add_argument("--users", type=int, default=2_000)
    p.add_argument("--items", type=int, default=400)
    p.add_argument("--stream-minutes", type=float, default=60.0, help="event time covered by the stream after T")
    p.add_argument("--drift", action="store_true", help="change the hidden model at T (concept drift; synthetic only)")
    p.add_argument("--corrupt-fraction", "--bad-fraction", dest="bad_fraction", type=float, default=0.0,
                   help="share of bad raw lines")
    p.add_argument("--empty-day", dest="empty_days", type=date.fromisoformat, action="append", default=[],
                   help="a day with no data at all (repeatable; not for the synthetic spec)")
    p.add_argument("--bursty", action="store_true",
                   help="real-log traffic: volume moving ±35%% from day to day with quieter weekends, and 5-60%% of each "
                        "day's events from three users (slipstream.dev.traffic; not for the synthetic spec)")
    p.add_argument("--affinity", type=float, default=None,
                   help="spread of the hidden user-item affinity (a spec naming a user and an item; default: "
                        "the generator's own, 1.0; 0: an additive hidden model, which a logistic regression "
                        "learns as well as any model; not for the synthetic spec)")
    p.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--no-stream", action="store_true", help="write the raw zone only")
    p.add_argument("--stream-as", choices=("events", "samples"), default="events",
                   help="the stream after T as raw impression and click events for the joiner (default; "
                        "`slipstream stack up --joiner` runs one), or as finished samples straight to the sample topic "
                        "(a spec whose generator makes no raw stream always gets samples)")
    p.set_defaults(func=run)


def _generate(args: argparse.Namespace, settings: Settings, spec: Spec) -> GeneratedData:
    if generates(spec):  # the shipped synthetic spec: its own generator
        if args.empty_days or args.bursty or args.affinity is not None:
            raise ConfigError("--empty-day, --bursty and --affinity are for the generic generator: give another --spec, "
                              "or leave them out")
        cfg = GeneratorConfig(
            start_day=args.start_day, days=args.days, impressions_per_day=args.events_per_day,
            users=args.users, items=args.items, stream_minutes=args.stream_minutes, drift=args.drift,
            corrupt_fraction=args.bad_fraction, fmt=args.format, seed=args.seed,
        )
        return generate(cfg, settings.raw_dir)
    from slipstream.dev.specgen import SpecGenConfig, generate_spec
    from slipstream.dev.traffic import Traffic

    if args.drift:
        raise ConfigError(f"--drift is for the synthetic spec only, not {spec.name!r}: leave it out")
    scfg = SpecGenConfig(
        start_day=args.start_day, days=args.days, events_per_day=args.events_per_day, users=args.users,
        items=args.items, stream_minutes=args.stream_minutes, bad_fraction=args.bad_fraction,
        empty_days=tuple(args.empty_days), fmt=args.format, seed=args.seed,
        traffic=Traffic.bursty() if args.bursty else None,
        **({} if args.affinity is None else {"affinity": args.affinity}),
    )
    return generate_spec(spec, scfg, settings.raw_dir)


def run(args: argparse.Namespace) -> int:
    settings = dataset_settings(args.spec)
    spec = load_spec(settings.spec)
    if not args.no_stream:  # fail before generating anything
        from slipstream.commands.sample_stream import require_broker

        require_broker(settings)
    data = _generate(args, settings, spec)
    manifest = write_manifest(data, settings.home / "generator" / "manifest.json")
    if not args.no_stream and args.stream_as == "events" and data.stream_events is not None:
        from slipstream.dev.raw_stream import produce_raw_stream
        from slipstream.stream.kafka import KafkaAccess

        manifest["produced_raw"] = produce_raw_stream(KafkaAccess.from_settings(settings), spec, data.stream_events,
                                                      settings.topic_partitions, home=settings.home)
        log.info("raw events produced: the joiner (slipstream stack up --joiner, or slipstream joiner run) turns "
                 "them into %d samples on %s", data.stream.num_rows, settings.topic)
    elif not args.no_stream:
        from slipstream.commands.sample_stream import produce_spec_samples

        manifest["produced"] = produce_spec_samples(settings, spec, data.stream)
    print(json.dumps(manifest, indent=2, default=str))
    return 0
