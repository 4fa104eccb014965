"""`slipstream import --spec S FILE…`: load a user's CSV / TSV / JSON lines / Parquet files into
the raw zone (`slipstream.lake.importer`), optionally producing the tail after T to Kafka."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, date, datetime
from pathlib import Path

from slipstream.commands import dataset_settings
from slipstream.lake.importer import ImportOptions, import_files
from slipstream.samples.spec import load_spec


def utc_time(text: str) -> datetime:
    """An ISO-8601 date or time; without an offset it is UTC."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO-8601 date or time: {text!r} (e.g. 2026-11-05 or 2026-11-05T12:00:00Z)"
        ) from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("import", help="load your CSV / TSV / JSONL / Parquet files into the raw zone, the spec's way")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    p.add_argument("--spec",
                   help="feature spec: a shipped name (synthetic, criteo, ratings) or a YAML path (default: SLIPSTREAM_SPEC)")
    p.add_argument("--source", help="the spec source every FILE feeds (default: the source each file's name starts with)")
    p.add_argument("--day", type=date.fromisoformat,
                   help="records without a time get one spread evenly over this UTC day, in file order")
    p.add_argument("--from", dest="time_from", type=utc_time, help="reject records before this time")
    p.add_argument("--to", dest="time_to", type=utc_time, help="reject records at or after this time")
    p.add_argument("--stream-after", type=utc_time, metavar="T",
                   help="events at or after T also go to the Kafka sample topic (as samples); every event goes to the raw zone")
    p.add_argument("--allow-missing", action="append", default=[], metavar="FIELD",
                   help="an optional FIELD may be absent from a file that has columns the spec does not know "
                        "(it takes its default); repeat it or give FIELD,FIELD")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = dataset_settings(args.spec)
    spec = load_spec(settings.spec)
    if args.stream_after is not None:  # fail before importing anything
        from slipstream.commands.sample_stream import require_broker

        require_broker(settings)
    raw = settings.raw_dir[len("file:"):] if settings.raw_dir.startswith("file:") else settings.raw_dir
    allowed = tuple(n.strip() for arg in args.allow_missing for n in arg.split(",") if n.strip())
    opts = ImportOptions(raw_dir=Path(raw), source=args.source, day=args.day, time_from=args.time_from,
                         time_to=args.time_to, stream_after=args.stream_after, allow_missing=allowed)
    result = import_files(spec, list(args.files), opts)
    produced = 0
    if result.tail is not None and result.tail.num_rows:
        from slipstream.commands.sample_stream import produce_spec_samples

        produced = produce_spec_samples(settings, spec, result.tail)
    if args.json:
        out = result.to_dict()
        if "stream" in out:
            out["stream"].update(produced=produced, topic=settings.topic)
        print(json.dumps(out, indent=2))
    else:
        print(result.render())
    return 0
