"""The backfill case of `slipstream bench preprocess`: a long history of small days, range job vs
day by day, in one Spark session, and the quality gate over the range.

Data: the synthetic generator's `--days` days (default 200) of `--day-rows` impressions (500), and
the same days at 10x the rows. Timed, in this order, after a warm-up of both paths on 3 days:

- `range_s_1x` / `range_s_10x`: `preprocess_range` over all the days (one pass, one snapshot);
- `day_by_day_s_1x`: the per-day path (`preprocess_day` in a loop, one commit per day) over the
  1x days, into its own catalog;
- `gate_s` / `read_s`: the window gate (`run_gate`, profiles of every day stored) over the 10x
  range at its snapshot, against reading the same rows (`read_interval`); a first gate over 3
  days of the 1x table runs before it (`gate_s_cold_3_days`: Great Expectations' import and
  context, once per process).

Derived: `backfill_speedup` = day_by_day_s_1x / range_s_1x (goal >= 10); the range job's cost as
days x fixed + rows x per-row from its two sizes, `per_day_fixed_s` = the fixed part per day
(goal <= 0.3); `gate_200_days_vs_read` = gate_s / read_s (goal <= 3). The 1x and 10x range runs
also check that each day's rows equal the generator's.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from slipstream.dev.datagen import GeneratorConfig, generate
from slipstream.lake.iceberg import get_catalog
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.samples.spec import load_spec
from slipstream.settings import Settings

log = logging.getLogger(__name__)
START = date(2025, 1, 1)
WARM_DAYS = 3


def _prepare(root: Path, days: int, rows: int) -> tuple[Settings, dict[str, int]]:
    settings = Settings(home=root)
    t0 = time.monotonic()
    cfg = GeneratorConfig(start_day=START, days=days, impressions_per_day=rows, users=max(2_000, rows * days // 200),
                          items=max(400, rows * days // 2000), stream_minutes=1.0)
    data = generate(cfg, settings.raw_dir)
    log.info("generated %d days x %d impressions in %.0fs", days, rows, time.monotonic() - t0)
    return settings, dict(data.raw_rows_per_day)


def _options(settings: Settings, run_id: str) -> Any:
    from spark_jobs.day_job import DayOptions

    spark = SparkSettings()
    return DayOptions(spec=load_spec(), raw_dir=settings.raw_dir, namespace=settings.namespace, run_id=run_id,
                      max_reject_rate=spark.max_reject_rate, target_bytes=spark.target_file_mb << 20)


def _range(spark: Any, settings: Settings, days: list[date], run_id: str) -> tuple[float, list[Any]]:
    from spark_jobs.range_job import preprocess_range

    t0 = time.monotonic()
    results = preprocess_range(spark, get_catalog(settings), _options(settings, run_id), days, {}, on_day=lambda r: None)
    return time.monotonic() - t0, results


def _day_by_day(spark: Any, settings: Settings, days: list[date], run_id: str) -> float:
    from spark_jobs.day_job import preprocess_day

    catalog, opts = get_catalog(settings), _options(settings, run_id)
    t0 = time.monotonic()
    for i, d in enumerate(days):
        preprocess_day(spark, catalog, opts, d, side_tables={})
        if i % 20 == 19:
            log.info("day by day: %d/%d days, ETA %.0fs", i + 1, len(days),
                     (time.monotonic() - t0) / (i + 1) * (len(days) - i - 1))
    return time.monotonic() - t0


def _warm_gate(settings: Settings, days: list[date], snapshot_id: int) -> float:
    """A first gate in the process pays Great Expectations' import and context (seconds, once per
    process, like Spark's start-up): run one on another table first, timed apart."""
    from slipstream.quality.gate import run_gate

    start = datetime(days[0].year, days[0].month, days[0].day, tzinfo=UTC)
    t0 = time.monotonic()
    run_gate(settings, spec=load_spec(), day=None, window=(start, start + timedelta(days=WARM_DAYS)), snapshot_id=snapshot_id,
             run_id="bench-gate-warm")
    return time.monotonic() - t0


def _gate(settings: Settings, days: list[date], snapshot_id: int) -> dict[str, float]:
    from slipstream.quality.gate import run_gate
    from slipstream.quality.reading import load_samples, read_interval

    spec = load_spec()
    start = datetime(days[0].year, days[0].month, days[0].day, tzinfo=UTC)
    end = start + timedelta(days=len(days))
    table = load_samples(get_catalog(settings), settings.namespace)
    read_interval(table, snapshot_id, start, end, spec.sample_columns)  # warm the page cache like the gate's own read
    t0 = time.monotonic()
    rows = read_interval(table, snapshot_id, start, end, spec.sample_columns).num_rows
    read_s = time.monotonic() - t0
    t0 = time.monotonic()
    result = run_gate(settings, spec=spec, day=None, window=(start, end), snapshot_id=snapshot_id, run_id="bench-gate")
    gate_s = time.monotonic() - t0
    return {"gate_s": gate_s, "read_s": read_s, "rows": float(rows), "gate_rows": float(result.rows),
            **{f"gate_{k}_s": v for k, v in result.timings.items()}}


def run_backfill(spark: Any, root: Path, days: int, day_rows: int) -> dict[str, Any]:
    """The backfill case (see the module docstring); `spark` is a started session."""
    x1, rows_1x = _prepare(root / "backfill-x1", days, day_rows)
    x10, rows_10x = _prepare(root / "backfill-x10", days, day_rows * 10)
    by_day = dataclasses.replace(x1, home=root / "backfill-day-by-day", raw_dir=x1.raw_dir)
    all_days = [START + timedelta(days=i) for i in range(days)]
    warm = all_days[:WARM_DAYS]
    _range(spark, dataclasses.replace(x1, home=root / "warm-range", raw_dir=x1.raw_dir), warm, "bench-warm")
    _day_by_day(spark, dataclasses.replace(x1, home=root / "warm-days", raw_dir=x1.raw_dir), warm, "bench-warm")

    range_1x, res_1x = _range(spark, x1, all_days, "bench-range-x1")
    range_10x, res_10x = _range(spark, x10, all_days, "bench-range-x10")
    for label, res, want in (("1x", res_1x, rows_1x), ("10x", res_10x, rows_10x)):
        got = {r.day: r.rows for r in res}
        if got != want:
            bad = [d for d in want if got.get(d) != want[d]][:5]
            raise RuntimeError(f"range job at {label}: rows per day differ from the generator's on {bad}")
    days_1x = _day_by_day(spark, by_day, all_days, "bench-days-x1")
    gate_cold = _warm_gate(x1, all_days, int(res_1x[0].snapshot_id))
    gate = _gate(x10, all_days, int(res_10x[0].snapshot_id))

    n1, n10 = sum(rows_1x.values()), sum(rows_10x.values())
    per_row = max(range_10x - range_1x, 0.0) / (n10 - n1)
    fixed = range_1x - per_row * n1
    return {
        "backfill_days": days,
        "backfill_rows_1x": n1,
        "backfill_rows_10x": n10,
        "range_s_1x": round(range_1x, 2),
        "range_s_10x": round(range_10x, 2),
        "day_by_day_s_1x": round(days_1x, 2),
        "day_by_day_s_per_day": round(days_1x / days, 3),
        "backfill_speedup": round(days_1x / range_1x, 2),
        "range_rows_per_s_1x": round(n1 / range_1x),
        "range_rows_per_s_10x": round(n10 / range_10x),
        "per_row_us": round(per_row * 1e6, 2),
        "per_day_fixed_s": round(fixed / days, 3),
        "gate_200_days_vs_read": round(gate["gate_s"] / gate["read_s"], 2),
        "gate_days": days,
        "gate_rows": int(gate["rows"]),
        "gate_s": round(gate["gate_s"], 2),
        "read_s": round(gate["read_s"], 2),
        "gate_s_cold_3_days": round(gate_cold, 2),
        "gate_phases_s": {k[len("gate_"):-2]: round(v, 2) for k, v in gate.items() if k.startswith("gate_") and k.endswith("_s")
                          and k not in ("gate_s",)},
        "backfill_goals": {"backfill_speedup": ">= 10", "per_day_fixed_s": "<= 0.3", "gate_200_days_vs_read": "<= 3"},
    }
