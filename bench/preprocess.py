"""`slipstream bench preprocess --json [--case day|backfill|all] [--impressions N] [--scale K] [--format jsonl|parquet]
[--days D] [--day-rows R]`

Throughput of the Spark preprocessing job against an I/O floor measured in the same Spark session:
the floor reads the same raw day with the same reader and schema and writes it as plain Parquet
(no validation, join, window or commit). `vs_io_floor` = job time / floor time (goal <= 2.0).
The job also runs on K x the data (default 5) to show how it scales (goal: 5x data <= 5.5x time).
Spark's start-up is reported apart (`spark_start_s`): the launched job pays it once per process.
A warm-up job runs first (reported as `job_s_1x_cold`), then the timed runs. The machine is shared:
compare ratios from one run only.

`--case backfill` (also part of `all`, the default) times a long history of small days: the range
job against the day-by-day path and the gate over the range (`bench/support/preprocess_backfill.py`).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

from slipstream.dev.datagen import GeneratorConfig, generate
from slipstream.lake.iceberg import get_catalog
from slipstream.lake.raw_zone import IMPRESSIONS, day_dir
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.processes import sigterm_deferred
from slipstream.samples.spec import load_spec
from slipstream.settings import Settings

log = logging.getLogger(__name__)
DAY = date(2026, 11, 1)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slipstream bench preprocess")
    p.add_argument("--impressions", type=int, default=2_000_000, help="impressions of the 1x day")
    p.add_argument("--scale", type=int, default=5, help="the larger run has this many times the data")
    p.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    # `slipstream bench preprocess --json` hands --json to us after the name: accept it.
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workdir", default="", help="keep data here (default: a temporary folder, removed)")
    p.add_argument("--case", choices=("day", "backfill", "all"), default="all",
                   help="day: one large day vs the I/O floor; backfill: many small days, range vs day by day")
    p.add_argument("--days", type=int, default=200, help="backfill: days of history")
    p.add_argument("--day-rows", type=int, default=500, help="backfill: impressions per day at 1x (10x is also run)")
    return p.parse_args(argv)


def _prepare(root: Path, impressions: int, fmt: str) -> Settings:
    settings = Settings(home=root)
    t0 = time.monotonic()
    cfg = GeneratorConfig(start_day=DAY, days=1, impressions_per_day=impressions, users=max(2_000, impressions // 100),
                          items=max(400, impressions // 1000), fmt=fmt, stream_minutes=1.0)
    generate(cfg, settings.raw_dir)
    log.info("generated %d impressions (%s) in %.0fs", impressions, fmt, time.monotonic() - t0)
    return settings


def _io_floor(spark: Any, settings: Settings, out: Path) -> tuple[float, int]:
    """Same listing and reader as the job, then a plain Parquet write."""
    from spark_jobs.raw_input import list_raw_files, read_raw, spark_schema

    t0 = time.monotonic()
    files = list_raw_files(spark, [day_dir(settings.raw_dir, IMPRESSIONS, DAY)])
    read_raw(spark, files, spark_schema(load_spec().events)).write.mode("overwrite").parquet(str(out))
    seconds = time.monotonic() - t0
    rows = spark.read.parquet(str(out)).count()
    return seconds, rows


def _job(spark: Any, settings: Settings, run_id: str) -> tuple[float, int]:
    from spark_jobs.day_job import DayOptions, preprocess_day

    spark_settings = SparkSettings()
    opts = DayOptions(spec=load_spec(), raw_dir=settings.raw_dir, namespace=settings.namespace, run_id=run_id,
                      max_reject_rate=spark_settings.max_reject_rate,
                      target_bytes=spark_settings.target_file_mb << 20)
    t0 = time.monotonic()
    result = preprocess_day(spark, get_catalog(settings), opts, DAY)
    return time.monotonic() - t0, result.rows


def main(argv: list[str]) -> dict[str, Any]:
    args = _parse(argv)
    if args.impressions < 1 or args.scale < 1:
        raise SystemExit("--impressions and --scale must be >= 1")
    if args.days < 4 or args.day_rows < 1:
        raise SystemExit("--days must be >= 4 and --day-rows >= 1")
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-preprocess-"))
    out: dict[str, Any] = {"benchmark": "preprocess", "case": args.case, "cores": os.cpu_count(),
                           "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
    try:
        from spark_jobs.preprocess import start_spark

        t0 = time.monotonic()
        spark = None
        try:
            # a SIGTERM while the JVM starts would lose its handle: take it once the session exists
            with sigterm_deferred():
                spark = start_spark(SparkSettings.from_env(), "bench-preprocess")
            out["spark_start_s"] = round(time.monotonic() - t0, 2)
            if args.case in ("day", "all"):
                out.update(_day_case(spark, root, args))
            if args.case in ("backfill", "all"):
                from bench.support.preprocess_backfill import run_backfill

                out.update(run_backfill(spark, root, args.days, args.day_rows))
        finally:
            if spark is not None:
                spark.stop()
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    out["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    return out


def _day_case(spark: Any, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One large day against the I/O floor, and K times that day."""
    small = _prepare(root / "x1", args.impressions, args.format)
    large = _prepare(root / f"x{args.scale}", args.impressions * args.scale, args.format)
    # Warm-up: the first job in a fresh JVM pays class loading, code generation, JIT and
    # the Python workers' imports (a fixed cost per process, like Spark's start-up).
    cold_s, _ = _job(spark, small, "bench-cold")
    _io_floor(spark, small, root / "warmup")
    floor_s, floor_rows = _io_floor(spark, small, root / "floor-x1")
    job_s, rows = _job(spark, small, "bench-x1")
    job_big_s, rows_big = _job(spark, large, f"bench-x{args.scale}")
    floor_big_s, _ = _io_floor(spark, large, root / f"floor-x{args.scale}")
    return {
        "format": args.format,
        "impressions_1x": args.impressions,
        "raw_records_read_by_floor_1x": floor_rows,
        "rows_1x": rows,
        "job_s_1x": round(job_s, 2),
        "job_rows_per_s": round(rows / job_s),
        "io_floor_s_1x": round(floor_s, 2),
        "io_floor_rows_per_s": round(floor_rows / floor_s),
        "vs_io_floor": round(job_s / floor_s, 2),
        "scale": args.scale,
        "rows_scaled": rows_big,
        "job_s_scaled": round(job_big_s, 2),
        "io_floor_s_scaled": round(floor_big_s, 2),
        "vs_io_floor_scaled": round(job_big_s / floor_big_s, 2),
        "time_ratio_scaled": round(job_big_s / job_s, 2),
        "job_s_1x_cold": round(cold_s, 2),
        "goals": {"vs_io_floor": "<= 2.0", "time_ratio_scaled": f"<= {1.1 * args.scale:.1f} for {args.scale}x data"},
    }
