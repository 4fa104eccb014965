"""The `slipstream` command line. Each command group lives in `slipstream.commands.<name>` and
registers its subcommands; this module only wires them and parses settings once."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from slipstream.errors import SlipstreamError
from slipstream.processes import exit_on_sigterm

COMMAND_MODULES = (
    "slipstream.commands.stack",
    "slipstream.commands.generate",
    "slipstream.commands.importer",
    "slipstream.commands.bench",
    "slipstream.commands.demo",
    "slipstream.commands.cache",
    "slipstream.commands.insight",
    "slipstream.commands.models",
    "slipstream.commands.ui",
    "slipstream.commands.joiner",
    "slipstream.commands.elastic",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slipstream", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    exit_on_sigterm()  # servers a command started are stopped by its finally blocks, on kill too
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except SlipstreamError as e:
        print(f"slipstream: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
