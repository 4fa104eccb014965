"""`slipstream insight --run ID` (the run's HTML report) and `slipstream quality check` (the gate)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, date, datetime

from slipstream.commands import dataset_settings
from slipstream.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("insight", help="render a training run's insight report (report.html)")
    p.add_argument("--run", required=True, help="run id: the folder name under SLIPSTREAM_RUNS_DIR")
    p.set_defaults(func=run_insight)

    q = sub.add_parser("quality", help="data-quality gate over the samples table")
    qsub = q.add_subparsers(dest="quality_command", required=True)
    c = qsub.add_parser("check", help="validate one day (or a window) at a pinned snapshot")
    c.add_argument("--day", type=date.fromisoformat, help="UTC day to check, YYYY-MM-DD")
    c.add_argument("--window-days", type=int, help="check the N days ending at --end instead of one day")
    c.add_argument("--end", type=datetime.fromisoformat, help="window end (ISO, UTC); with --window-days")
    c.add_argument("--snapshot-id", type=int, help="pinned snapshot (default: the current one, pinned now)")
    c.add_argument("--run-id", default=None, help="results are recorded under this id (default manual-<utc time>)")
    c.add_argument("--spec", default=None, help="the data set's feature spec (default SLIPSTREAM_SPEC)")
    for name in ("ctr-min", "ctr-max", "rows-ratio-min", "rows-ratio-max"):
        c.add_argument(f"--{name}", type=float, default=None,
                       help=f"this check's own bound (the DAG param gate_{name.replace('-', '_')}), "
                       "over the learned and the spec's")
    c.set_defaults(func=run_check)


def run_insight(args: argparse.Namespace) -> int:
    from slipstream.quality.report import render_report

    path = render_report(Settings.from_env(), args.run)
    print(path)
    return 0


def run_check(args: argparse.Namespace) -> int:
    from slipstream.errors import ConfigError
    from slipstream.lake.iceberg import get_catalog
    from slipstream.lake.planning import pin_snapshot, window_bounds
    from slipstream.quality.bounds import GateOverrides
    from slipstream.quality.gate import run_gate
    from slipstream.quality.reading import load_samples
    from slipstream.samples.spec import load_spec

    settings = dataset_settings(args.spec)
    if (args.day is None) == (args.window_days is None):
        raise ConfigError("give exactly one of --day D or --window-days N (with --end)")
    window = None
    if args.window_days is not None:
        if args.end is None:
            raise ConfigError("--window-days needs --end (e.g. 2026-11-04T00:00:00+00:00)")
        window = window_bounds(args.end if args.end.tzinfo else args.end.replace(tzinfo=UTC), args.window_days)
    snapshot = pin_snapshot(load_samples(get_catalog(settings), settings.namespace), args.snapshot_id)
    run_id = args.run_id or "manual-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    overrides = GateOverrides(ctr_min=args.ctr_min, ctr_max=args.ctr_max,
                              rows_ratio_min=args.rows_ratio_min, rows_ratio_max=args.rows_ratio_max)
    spec = load_spec(settings.spec)
    result = run_gate(settings, spec=spec, day=args.day, window=window, snapshot_id=snapshot, run_id=run_id,
                      overrides=overrides)
    print(json.dumps(result.to_dict(), indent=2))
    return 0
