"""`slipstream bench NAME [--json] [args...]`: runs `bench/NAME.py` and prints its JSON result."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark from bench/ (prints one JSON object)")
    p.add_argument("name", help="benchmark module in bench/, e.g. loader, preprocess, warmup")
    p.add_argument("--json", action="store_true", help="print only the JSON result on stdout")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import bench
    except ImportError:
        print("slipstream bench: the bench/ folder is not importable; run from the repository root", file=sys.stderr)
        return 2
    names = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_"))
    if args.name not in names:
        print(f"slipstream bench: no benchmark {args.name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    # `--json` may come after the name (`slipstream bench loader --json`): it is ours, not the bench's
    rest = [a for a in args.rest if a != "--json"]
    compact = args.json or len(rest) != len(args.rest)
    module = importlib.import_module(f"bench.{args.name}")
    result = module.main(rest)
    print(json.dumps(result, indent=None if compact else 2, default=str))
    return 0
