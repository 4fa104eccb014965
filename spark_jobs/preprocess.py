"""Preprocess raw days into the Iceberg table `samples`: one Spark pass and one snapshot for all the
days (`spark_jobs.range_job`; `--day-by-day`: one commit per day, `spark_jobs.day_job`).

    python -m spark_jobs.preprocess --day 2026-11-01 [--day 2026-11-02 ...] --run-id R
    spark-submit spark_jobs/preprocess.py --day 2026-11-01 --run-id R
    SLIPSTREAM_SPARK_REMOTE=sc://127.0.0.1:15002 python -m spark_jobs.preprocess ...   # a warm Spark Connect server

Settings come from the environment (`SLIPSTREAM_*` for the catalog and raw zone,
`SLIPSTREAM_SPARK_*` for Spark); flags override the job limits. Spark's and our logs go to
stderr; stdout carries exactly ONE JSON line at the end:
`{"run_id": ..., "days": [{"day", "snapshot_id", "rows", "rejects", ...}], "error": null|"...",
"error_type": null|"RawDataError"|...}`. The exit status is 0 only when every day committed.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # spark-submit by path: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from datetime import date  # noqa: E402
from typing import Any  # noqa: E402

from slipstream.errors import ConfigError, SlipstreamError  # noqa: E402
from slipstream.settings import Settings  # noqa: E402
from slipstream.pipeline.spark_settings import SparkSettings, check_job_limits  # noqa: E402

log = logging.getLogger("spark_jobs.preprocess")


def parse_args(argv: list[str] | None, spark: SparkSettings) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="spark_jobs.preprocess", description=__doc__.split("\n")[0])
    p.add_argument("--day", dest="days", action="append", type=date.fromisoformat, required=True,
                   help="UTC day to (re)build, YYYY-MM-DD; repeat for several days in one session")
    p.add_argument("--run-id", required=True, help="recorded in the snapshot summary and the rejects")
    p.add_argument("--raw-dir", default="", help="raw zone (default SLIPSTREAM_RAW_DIR)")
    p.add_argument("--spec", default="", help="feature spec: a shipped spec's name or a YAML path (default SLIPSTREAM_SPEC)")
    p.add_argument("--attribution-s", type=int, default=None, help="click-within specs: override the spec's window")
    p.add_argument("--max-reject-rate", type=float, default=spark.max_reject_rate)
    p.add_argument("--target-file-mb", type=int, default=spark.target_file_mb)
    p.add_argument("--write-mode", choices=("pyarrow", "native"), default=spark.write_mode)
    p.add_argument("--summary-out", default="", help="also write the JSON summary to this file")
    p.add_argument("--day-by-day", action="store_true",
                   help="one read, write and commit per day (the range job's reference; the default reads the days in one pass)")
    args = p.parse_args(argv)
    check_job_limits(args.max_reject_rate, args.target_file_mb)
    return args


def start_spark(spark_settings: SparkSettings, app: str) -> Any:
    """A Spark session: a client of the warm Spark Connect server when SLIPSTREAM_SPARK_REMOTE names
    one, else a Spark of its own (`local[*]` or the cluster's master)."""
    from pyspark.sql import SparkSession

    if spark_settings.remote:
        session = SparkSession.builder.remote(spark_settings.remote).getOrCreate()
        for k, v in spark_settings.session_conf().items():
            session.conf.set(k, v)
        return session
    builder = SparkSession.builder.appName(app).master(spark_settings.master)
    conf = spark_settings.spark_conf()
    if spark_settings.is_local:
        # Python workers (mapInArrow) must run our interpreter: the system python3 lacks pyarrow.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for k, v in conf.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def share_side_tables(spark: Any, blobs: dict[str, bytes]) -> Any:
    """The side tables' bytes as the writer's tasks get them: a broadcast on a classic session; a
    Spark Connect session has no SparkContext, so the bytes travel inside the task's closure."""
    try:
        return spark.sparkContext.broadcast(blobs)
    except Exception:  # pyspark's Connect session refuses sparkContext  # noqa: BLE001
        return blobs


def run(args: argparse.Namespace, settings: Settings, spark_settings: SparkSettings) -> dict[str, Any]:
    """Run the job; returns the summary (also on failure, with `error` set)."""
    summary: dict[str, Any] = {"run_id": args.run_id, "days": [], "error": None, "error_type": None}
    t0 = time.monotonic()
    spark = None
    try:
        from slipstream.lake.iceberg import get_catalog, samples_table
        from slipstream.samples.spec import load_spec
        from spark_jobs.day_job import DayOptions, preprocess_day, read_side_tables
        from spark_jobs.finisher import tables_to_ipc
        from spark_jobs.range_job import preprocess_range

        spec = load_spec(args.spec or settings.spec)
        opts = DayOptions(
            spec=spec,
            raw_dir=args.raw_dir or settings.raw_dir, namespace=settings.namespace, run_id=args.run_id,
            attribution_s=args.attribution_s, max_reject_rate=args.max_reject_rate,
            target_bytes=args.target_file_mb * 1024 * 1024, write_mode=args.write_mode,
            spark_catalog=spark_settings.iceberg_catalog or settings.catalog,
            raw_io=settings.s3_io_properties(),
        )
        catalog = get_catalog(settings)
        samples_table(catalog, settings.namespace, spec)  # a new feature evolves the table once, up front
        spark = start_spark(spark_settings, f"slipstream-preprocess-{args.run_id}")
        log.info("Spark %s up in %.1fs (%s)", spark.version, time.monotonic() - t0,
                 f"Spark Connect {spark_settings.remote}" if spark_settings.remote else f"master {spark_settings.master}")
        if not spark_settings.is_local and not spark_settings.remote:
            summary["executor_code"] = executor_code(spark)
        tables = read_side_tables(spec, opts.raw_dir, opts.raw_io)
        side = share_side_tables(spark, tables_to_ipc(tables)) if tables else None
        days = sorted(set(args.days))
        if (args.day_by_day or opts.write_mode == "native") and spark_settings.remote:
            raise ConfigError("the day-by-day path and native writes need a Spark of the job's own (they use the "
                              "SparkContext): unset SLIPSTREAM_SPARK_REMOTE for them")
        if args.day_by_day or opts.write_mode == "native":
            for i, day in enumerate(days):
                result = preprocess_day(spark, catalog, opts, day, side_tables=side if side is not None else {})
                summary["days"].append(result.to_dict())
                done = time.monotonic() - t0
                log.info("progress: %d/%d days, ETA %.0fs", i + 1, len(days), done / (i + 1) * (len(days) - i - 1))
        else:
            preprocess_range(spark, catalog, opts, days, side if side is not None else {},
                             on_day=lambda r: summary["days"].append(r.to_dict()))
    except SlipstreamError as e:
        log.error("%s", e)
        summary.update(error=str(e), error_type=type(e).__name__)
    except Exception as e:  # a bug or an engine failure: still report it in the one JSON line
        log.exception("preprocessing failed")
        summary.update(error=f"{type(e).__name__}: {_tail(str(e))}", error_type="RuntimeError")
    finally:
        if spark is not None:
            spark.stop()
    summary["seconds"] = round(time.monotonic() - t0, 3)
    return summary


def executor_code(spark: Any) -> list[str]:
    """Where the executors import `slipstream` from (one task per core): on a cluster this must be
    the zip shipped with --py-files, not a copy that happens to be on the workers' path."""
    def origin(_: object) -> str:
        import slipstream

        return str(slipstream.__file__)

    n = max(1, spark.sparkContext.defaultParallelism)
    where = sorted(set(spark.sparkContext.parallelize(range(n), n).map(origin).collect()))
    log.info("executors import slipstream from %s", ", ".join(where))
    return where


def _tail(text: str, lines: int = 6) -> str:
    """The end of an engine error (a Python worker's traceback ends with the real cause)."""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])[:2000]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings.from_env()
        spark_settings = SparkSettings.from_env()
        args = parse_args(argv, spark_settings)
    except SlipstreamError as e:  # bad settings or flags: same one-line contract as a failed run
        print(json.dumps({"run_id": None, "days": [], "error": str(e), "error_type": type(e).__name__}), flush=True)
        return 2
    summary = run(args, settings, spark_settings)
    line = json.dumps(summary, default=str)
    if args.summary_out:
        Path(args.summary_out).write_text(line + "\n")
    print(line, flush=True)
    return 0 if summary["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
