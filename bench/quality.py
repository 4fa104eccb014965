"""`slipstream bench quality`: the gate + profile of a generated day vs reading its columns.

Generates one realistic day of samples (`datagen.reference_samples`, default 5M rows) plus a
trailing day (the same rows shifted back a day, so the row-count and drift checks have history),
commits both to a throwaway SQLite Iceberg catalog, then measures in the same process:
- `read_s`: pyarrow reading the day's data files, all sample columns (the baseline);
- `gate_s`: `run_gate` end to end with the default config (read, profile, aggregates, Great
  Expectations, Iceberg writes, HTML and GX Data Docs), and `gate_without_data_docs_s`.
Both sides run `--repeat` times, interleaved (read, gate, gate without Data Docs, read, ...), and
the medians are reported, with every run in `runs_s`. `vs_read = gate_s / read_s` (medians; goal
<= 2.0) and `rows_per_s = rows / gate_s` (goal >= 500k on 2 cores).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path
from statistics import median
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

log = logging.getLogger(__name__)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slipstream bench quality")
    p.add_argument("--rows", type=int, default=5_000_000, help="rows in the checked day")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of each side (medians are reported)")
    p.add_argument("--keep", action="store_true", help="keep the temporary SLIPSTREAM_HOME")
    # `slipstream bench quality --json` hands its --json to us (argparse REMAINDER): accept it.
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat must be >= 1, got {args.repeat}")
    return args


def _shift_back(t: pa.Table) -> pa.Table:
    ts = pc.cast(pc.subtract(pc.cast(t.column("event_time"), pa.int64()), 86_400_000_000), t.schema.field("event_time").type)
    t = t.set_column(t.schema.get_field_index("event_time"), "event_time", ts)
    ids = pc.binary_join_element_wise("prev-", t.column("sample_id"), "")
    return t.set_column(t.schema.get_field_index("sample_id"), "sample_id", ids)


GENERATE_MAX = 1_000_000
"""The generator's sequence feature needs ~1 KB of memory per row while it runs: bigger days
are this many generated rows repeated under new sample ids (same distributions)."""


def _tile(t: pa.Table, rows: int) -> pa.Table:
    parts: list[pa.Table] = []
    k = 0
    while sum(p.num_rows for p in parts) < rows:
        part = t.slice(0, rows - sum(p.num_rows for p in parts))
        if k:
            ids = pc.binary_join_element_wise(f"r{k}-", part.column("sample_id"), "")
            part = part.set_column(part.schema.get_field_index("sample_id"), "sample_id", ids)
        parts.append(part)
        k += 1
    return pa.concat_tables(parts).combine_chunks()


def _rounded(xs: list[float]) -> list[float]:
    return [round(x, 3) for x in xs]


def main(argv: list[str]) -> dict[str, Any]:
    args = _parse(argv)
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    from slipstream.dev.datagen import GeneratorConfig, reference_samples
    from slipstream.lake.iceberg import get_catalog, samples_table
    from slipstream.quality.config import GateConfig
    from slipstream.quality.gate import run_gate
    from slipstream.quality.profiles import profile_table
    from slipstream.quality.store import write_profile
    from slipstream.samples.schema import ARROW_SCHEMA, DEFAULT_SPEC, SAMPLE_COLUMNS
    from slipstream.settings import Settings

    home = Path(tempfile.mkdtemp(prefix="slipstream-bench-quality-"))
    try:
        t0 = time.monotonic()
        day = date(2026, 11, 2)
        base = min(args.rows, GENERATE_MAX)
        cfg = GeneratorConfig(start_day=day, days=1, impressions_per_day=base, users=200_000, items=50_000, seed=5)
        today = _tile(reference_samples(cfg)[str(day)].cast(ARROW_SCHEMA), args.rows)
        gen_s = time.monotonic() - t0
        settings = Settings(home=home)
        catalog = get_catalog(settings)
        table = samples_table(catalog, settings.namespace)
        before = _shift_back(today)
        table.append(before)
        table.append(today)
        current = table.current_snapshot()
        assert current is not None, "two days were just appended"
        snap = current.snapshot_id
        write_profile(catalog, settings.namespace, day=day - timedelta(days=1), snapshot_id=snap, run_id="bench",
                      profile=profile_table(before, DEFAULT_SPEC))
        del before
        setup_s = time.monotonic() - t0
        import great_expectations  # noqa: F401  (a one-off per process; reported, not counted)

        gx_import_s = time.monotonic() - t0 - setup_s
        day_number = (day - date(1970, 1, 1)).days
        files = [t.file.file_path for t in table.scan(snapshot_id=snap).plan_files() if t.file.partition[0] == day_number]

        def read_baseline() -> float:
            s = time.monotonic()
            parts = []
            for f in files:
                with table.io.new_input(f).open() as fh:
                    parts.append(pq.read_table(fh, columns=list(SAMPLE_COLUMNS)))
            n = sum(p.num_rows for p in parts)
            assert n == args.rows, (n, args.rows)
            return time.monotonic() - s

        # Same number of runs of each side, interleaved so that both see the same load; medians.
        read_s, gate_s, gate_nodocs_s = [], [], []
        timings: list[dict[str, float]] = []
        no_docs = GateConfig(data_docs=False)
        for i in range(args.repeat):
            read_s.append(read_baseline())
            s = time.monotonic()
            res = run_gate(settings, spec=DEFAULT_SPEC, day=day, window=None, snapshot_id=snap, run_id=f"bench-{i}")
            gate_s.append(time.monotonic() - s)
            s = time.monotonic()
            fast = run_gate(settings, spec=DEFAULT_SPEC, day=day, window=None, snapshot_id=snap, run_id=f"bench-nodocs-{i}",
                            config=no_docs)
            gate_nodocs_s.append(time.monotonic() - s)
            timings.append(fast.timings)
        med_read, med_gate, med_nodocs = median(read_s), median(gate_s), median(gate_nodocs_s)
        return {
            "rows": args.rows,
            "files": len(files),
            "repeat": args.repeat,
            "read_s": round(med_read, 3),
            "gate_s": round(med_gate, 3),
            "vs_read": round(med_gate / med_read, 3),
            "goal_vs_read": 2.0,
            "gate_without_data_docs_s": round(med_nodocs, 3),
            "vs_read_without_data_docs": round(med_nodocs / med_read, 3),
            "rows_per_s": round(args.rows / med_gate),
            "read_rows_per_s": round(args.rows / med_read),
            "goal_rows_per_s": 500_000,
            "runs_s": {"read": _rounded(read_s), "gate": _rounded(gate_s), "gate_without_data_docs": _rounded(gate_nodocs_s)},
            "vs_read_per_run": _rounded([g / r for g, r in zip(gate_s, read_s)]),
            "breakdown_s": {**{k: round(median([t[k] for t in timings]), 3) for k in timings[0]},
                            "gx_data_docs_extra": round(med_gate - med_nodocs, 3)},
            "gate_passed": res.passed,
            "warnings": [w.line() for w in res.warnings],
            "expectations": len(res.results),
            "gx_import_s": round(gx_import_s, 3),
            "generate_s": round(gen_s, 1),
            "setup_s": round(setup_s, 1),
            "cpu_count": os.cpu_count(),
        }
    finally:
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
