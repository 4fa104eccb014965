"""`slipstream cache warm|status|evict`: the node-local cache of a training window's files."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from slipstream.cache.settings import CacheSettings, parse_bytes
from slipstream.errors import ConfigError
from slipstream.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cache", help="warm, inspect or evict the node-local cache of warehouse files")
    sp = p.add_subparsers(dest="action", required=True)
    w = sp.add_parser("warm", help="copy the files of a training window at a pinned snapshot into the cache")
    w.add_argument("--plan", help="a run's plan.json: warm exactly its files, into its cache dir (the other "
                   "window options do not apply)")
    w.add_argument("--table", default="samples", help="table name (in SLIPSTREAM_NAMESPACE) or ns.table")
    w.add_argument("--window-days", type=int, help="days in the window, ending at --end (required without --plan)")
    w.add_argument("--end", help="window end, ISO 8601 (default: the next UTC midnight)")
    w.add_argument("--snapshot", type=int, help="pinned snapshot id (default: the current one, pinned now)")
    w.add_argument("--cache-dir", help="cache root (default SLIPSTREAM_CACHE_DIR)")
    w.add_argument("--budget", help="size cap, e.g. 50GiB (default SLIPSTREAM_CACHE_BUDGET_BYTES)")
    w.add_argument("--json", action="store_true", help="print only the JSON report")
    w.set_defaults(func=_warm)
    s = sp.add_parser("status", help="what the cache holds, per table and snapshot")
    s.add_argument("--cache-dir")
    s.set_defaults(func=_status)
    e = sp.add_parser("evict", help="drop cached files")
    e.add_argument("--cache-dir")
    e.add_argument("--table", help="only this table's files (ns.table)")
    e.add_argument("--keep", help="evict least-recently-used files until at most this many bytes remain")
    e.add_argument("--all", action="store_true", help="drop everything (or all of --table)")
    e.set_defaults(func=_evict)


def parse_end(text: str | None) -> datetime:
    if not text:  # the window up to the end of today (UTC): everything landed so far
        now = datetime.now(UTC)
        return datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    try:
        end = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"--end must be an ISO 8601 time like 2026-03-05T00:00:00+00:00, got {text!r}") from None
    return end if end.tzinfo else end.replace(tzinfo=UTC)


def _warm(args: argparse.Namespace) -> int:
    from slipstream.cache.warm import warm_plan, warm_window

    settings = Settings.from_env()
    budget = parse_bytes(args.budget, "--budget") if args.budget else None
    if args.plan:
        from pathlib import Path

        from slipstream.pipeline.runplan import read_plan

        if args.window_days is not None or args.end or args.snapshot is not None or args.cache_dir:
            raise ConfigError("--plan fixes the window, snapshot and cache dir: drop --window-days/--end/--snapshot/--cache-dir")
        report = warm_plan(settings, read_plan(Path(args.plan)), budget)
    elif args.window_days is None:
        raise ConfigError("give --window-days N (with --end) or --plan PATH")
    else:
        report = warm_window(settings, args.table, args.window_days, parse_end(args.end), args.snapshot,
                             args.cache_dir, budget)
    print(json.dumps(report.to_dict(), indent=None if args.json else 2))
    return 0


def _status(args: argparse.Namespace) -> int:
    from slipstream.cache.index import CacheIndex, CacheLayout

    settings = Settings.from_env()
    cache = CacheSettings.from_env(settings)
    layout = CacheLayout(args.cache_dir or cache.dir)
    with CacheIndex(layout) as index:
        entries = index.entries()
        on_disk = index.total_bytes()
        blocks = len(index.blocks())
    groups: dict[str, dict[str, int]] = defaultdict(lambda: {"files": 0, "bytes": 0})
    for e in entries:
        g = groups[f"{e.table_name or '(read-populated)'}@{e.snapshot if e.snapshot is not None else '-'}"]
        g["files"] += 1
        g["bytes"] += e.size
    print(json.dumps({
        "cache_dir": str(layout.root), "files": len(entries), "bytes": on_disk,
        "packed_files": sum(1 for e in entries if e.block is not None), "blocks": blocks,
        "budget_bytes": cache.budget_bytes, "by_table_snapshot": dict(groups),
        "in_flight_tmp": len(list(layout.tmp.glob("*.part"))),
    }, indent=2))
    return 0


def _evict(args: argparse.Namespace) -> int:
    from slipstream.cache.evict import evict_cache

    settings = Settings.from_env()
    cache = CacheSettings.from_env(settings)
    if not args.all and args.keep is None:
        raise ConfigError("say what to evict: --all (optionally with --table) or --keep BYTES")
    keep = (parse_bytes(args.keep, "--keep") or 0) if args.keep is not None else None
    out = evict_cache(args.cache_dir or cache.dir, table_name=args.table, keep_bytes=keep,
                      lock_timeout_s=cache.lock_timeout_s)
    print(json.dumps({"evicted": out.files, "evicted_bytes": out.bytes}))
    return 0
