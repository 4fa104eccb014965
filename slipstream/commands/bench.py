"""`slipstream bench [NAME [--json] [args...]]`: runs benchmark NAME and prints its JSON result;
without a name, lists the benchmarks (`bench.BENCHMARKS`)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="run a benchmark from bench/ (prints one JSON object); no name: list them")
    p.add_argument("name", nargs="?", help="the benchmark, e.g. loader, preprocess, warmup (none: list them)")
    p.add_argument("--json", action="store_true", help="print only the JSON result on stdout")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import bench
    except ImportError:
        print("slipstream bench: the bench/ folder is not importable; run from the repository root", file=sys.stderr)
        return 2
    if not args.name:
        width = max(len(b.name) for b in bench.BENCHMARKS)
        for b in bench.BENCHMARKS:
            print(f"{b.name:<{width}}  {b.summary}")
        return 0
    if args.name not in bench.BY_NAME:
        names = ", ".join(b.name for b in bench.BENCHMARKS)
        print(f"slipstream bench: no benchmark {args.name!r}; the benchmarks are: {names}", file=sys.stderr)
        return 2
    # `--json` may come after the name (`slipstream bench loader --json`): it is ours, not the bench's
    rest = [a for a in args.rest if a != "--json"]
    compact = args.json or len(rest) != len(args.rest)
    module = importlib.import_module(f"bench.{args.name}")
    result = module.main(rest)
    print(json.dumps(result, indent=None if compact else 2, default=str))
    return 0
