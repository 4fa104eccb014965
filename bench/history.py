"""`slipstream bench history --json [--days 206] [--rows 100000] [--stream-days 28] [--epochs 8]
[--batch-size 256] [--lr 0.01] [--compare-day-by-day] [--workdir DIR]`

A new user's first load, timed: a ratings-layout history from `slipstream import` to a trained,
promoted model. The baseline is the goal of 3 minutes on this machine (`total_vs_goal`), and, with
`--compare-day-by-day`, the per-day job over the same days in the same run.

Data (untimed): the ratings spec's generator (`slipstream.dev.specgen`, with its user-item
affinity) draws `--rows` ratings over `--days` days (MovieLens 100k's shape by default), written as
the three MovieLens-layout CSV files a user has: ratings.csv (epoch-second times), users.csv and
items.csv (empty cells where a value is missing). T is the midnight `--stream-days` before the
file's end: the days before it are the history the run trains from Iceberg, the days after it the
stream it trains from the broker and is judged on (its forward tail: the last fifth by event time,
never trained). The embedded stack (broker, Airflow's home) starts in a home of its own, untimed.

Timed, as a user would run them:
- `import_s`: `slipstream import --spec ratings --stream-after T ratings.csv users.csv items.csv`:
  the history into the raw zone, one folder per day, and the days after T to the broker as samples;
- `retrain_s`: `airflow dags test daily_retrain` at T over the whole history before T (the range job, the
  gate, the warmup, torchrun over Iceberg and then the stream, the forward tail, publish, report);
- `total_s` = import_s + retrain_s (goal <= 180 s).

Reported: whether the model was promoted and why (model and logistic baseline on the forward tail,
with rows, users and 95% intervals), rows per stage. `--compare-day-by-day` then builds the same
raw days with the job's day-by-day path (`--day-by-day`, one commit per day) into a table of its own
and compares both tables row for row with a fresh pyiceberg scan (`same_rows`, `day_by_day_s`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pj
import pyarrow.parquet as pq

from slipstream.samples.spec import Spec, load_spec
from slipstream.settings import Settings

log = logging.getLogger(__name__)
SPEC = "ratings"
GOAL_S = 180.0


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slipstream bench history", description=__doc__.split("\n\n")[1])
    p.add_argument("--days", type=int, default=206, help="days the ratings file covers")
    p.add_argument("--rows", type=int, default=100_000, help="ratings in the file")
    p.add_argument("--stream-days", type=int, default=28,
                   help="the file's last days, imported to the stream (--stream-after T); the rest is the window")
    p.add_argument("--users", type=int, default=2_000)
    p.add_argument("--items", type=int, default=400)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--compare-day-by-day", action="store_true",
                   help="also build the days with the per-day job and compare both tables row for row")
    p.add_argument("--workdir", help="keep everything here (default: a temporary folder, removed afterwards)")
    args = p.parse_args(argv)
    if args.rows < args.days or not 1 <= args.stream_days <= args.days - 2:
        raise SystemExit("--rows must be >= --days, and --stream-days between 1 and --days - 2 (the window needs "
                         "two days: one to train on, the last one to validate on)")
    return args


def write_rating_files(spec: Spec, out: Path, *, start: date, days: int, per_day: int, users: int, items: int,
                       seed: int) -> dict[str, Any]:
    """The generator's ratings for `days` days from `start`, as ratings.csv, users.csv and items.csv
    in `out` (the layout `specs/ratings.yaml` describes). Returns the files and their rows."""
    from slipstream.dev.specgen import SpecGenConfig, generate_spec

    raw = out / "generated"
    cfg = SpecGenConfig(start_day=start, days=days, events_per_day=per_day, users=users, items=items,
                        stream_minutes=1.0, seed=seed)
    generate_spec(spec, cfg, raw)
    parts = sorted((raw / spec.events.name).rglob("*.jsonl.gz"))
    ratings = pa.concat_tables([pj.read_json(p) for p in parts])
    seconds = pc.divide(pc.cast(pc.cast(ratings.column("ts"), pa.timestamp("us", tz="UTC")), pa.int64()), 1_000_000)
    ratings = pa.table({"user_id": ratings.column("user_id"), "item_id": ratings.column("item_id"),
                        "rating": ratings.column("rating"), "ts": seconds})
    files = {"ratings": out / "ratings.csv"}
    pcsv.write_csv(ratings, files["ratings"])
    rows = {"ratings": ratings.num_rows}
    for t in spec.tables:
        table = pq.read_table(raw / t.name / "part-0.parquet")
        files[t.name] = out / f"{t.name}.csv"
        pcsv.write_csv(table, files[t.name])
        rows[t.name] = table.num_rows
    shutil.rmtree(raw)
    return {"files": {k: str(v) for k, v in files.items()}, "rows": rows}


def _timed(argv: list[str], env: dict[str, str], log_path: Path) -> float:
    t0 = time.monotonic()
    with open(log_path, "wb") as logf:
        rc = subprocess.run(argv, env=env, stdout=logf, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise SystemExit(f"`{' '.join(argv[:6])} ...` failed with exit code {rc}; its log: {log_path}")
    return time.monotonic() - t0


def main(argv: list[str]) -> dict[str, Any]:
    args = _parse(argv)
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-history-"))
    out: dict[str, Any] = {"benchmark": "history", "cores": os.cpu_count(),
                           "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}
    try:
        out.update(_run(args, root))
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    out["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    return out


def _run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from slipstream.dev import stack
    from slipstream.dev.demo import child_env, newest_run, run_dag
    from slipstream.pipeline.run_metrics import read_run_metrics
    from slipstream.pipeline.runlayout import read_summary

    spec = load_spec(SPEC)
    # the file ends before yesterday (a day not over is not trained on, and no event is in the future)
    start = datetime.now(UTC).date() - timedelta(days=args.days + 1)
    window = args.days - args.stream_days
    t = datetime.combine(start + timedelta(days=window), datetime.min.time(), tzinfo=UTC)
    t0 = time.monotonic()
    data = write_rating_files(spec, root / "files", start=start, days=args.days, per_day=args.rows // args.days,
                              users=args.users, items=args.items, seed=args.seed)
    log.info("wrote %s in %.0f s", data["rows"], time.monotonic() - t0)

    port = stack.free_port()
    settings = Settings(home=root / "home", kafka_port=port, kafka_bootstrap=f"127.0.0.1:{port}").for_dataset(SPEC)
    t0 = time.monotonic()
    try:  # `down` stops whatever `up` started, also when `up` fails half-way or the bench is stopped
        state = stack.up(settings)
        settings = dataclasses.replace(stack.effective_settings(settings), kafka_bootstrap=state.services["kafka"].address)
        stack_s = time.monotonic() - t0
        env = child_env(settings)
        files = data["files"]
        import_s = _timed([sys.executable, "-m", "slipstream.cli", "import", "--json", "--spec", SPEC, "--stream-after",
                           t.isoformat(), files["ratings"], files["users"], files["items"]], env, root / "import.log")
        conf = {"window_days": window, "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                "stream_stop": "caught_up"}
        t0 = time.monotonic()
        run_dag(settings, t.date().isoformat(), conf, root / "daily_retrain.log")
        retrain_s = time.monotonic() - t0
        run_dir = newest_run(Path(settings.runs_dir))
        metrics = read_run_metrics(run_dir)
        publish = read_summary(run_dir).get("publish") or {}
        result: dict[str, Any] = {
            "days": args.days, "window_days": window, "stream_days": args.stream_days, "t_handoff": t.isoformat(),
            "rows": data["rows"],
            "stack_s": round(stack_s, 1), "import_s": round(import_s, 1), "retrain_s": round(retrain_s, 1),
            "total_s": round(import_s + retrain_s, 1), "total_vs_goal": round((import_s + retrain_s) / GOAL_S, 2),
            "goal": f"total_s <= {GOAL_S:.0f} and promoted",
            "samples_iceberg": metrics.samples_iceberg, "samples_kafka": metrics.samples_kafka,
            "forward_tail_stream": metrics.forward_tail_stream,
            "promoted": bool(publish.get("promoted")), "reason": publish.get("reason"),
            "forward_tail": _scores(metrics.evaluation.forward_tail),
            "conf": conf,
        }
    finally:
        stack.down(settings)
    if args.compare_day_by_day:  # Spark and the catalogs only: the stack is down by now
        result.update(_compare(settings, spec, start, window))
    return result


def _scores(ev: Any) -> dict[str, Any] | None:
    if ev is None:
        return None
    return {"rows": ev.rows, "users": ev.users,
            "model": ev.model.model_dump() if ev.model else None,
            "baseline": ev.baseline.model_dump() if ev.baseline else None,
            "model_minus_baseline": ev.vs_baseline.model_dump() if ev.vs_baseline else None}


def _compare(settings: Settings, spec: Spec, start: date, days: int) -> dict[str, Any]:
    """The same raw days through the preprocessing job's day-by-day path (one commit per day) into
    another home's catalog, then both tables read afresh with pyiceberg, sorted by sample id,
    compared column by column. `day_by_day_s` includes that job's Spark start-up."""
    from slipstream.lake.iceberg import get_catalog, samples_table
    from slipstream.pipeline.preprocess_launch import run_preprocess_days

    by_day = Settings(home=settings.home.parent / "day-by-day", raw_dir=settings.raw_dir, spec=SPEC)
    t0 = time.monotonic()
    run_preprocess_days(by_day, [start + timedelta(days=i) for i in range(days)], "bench-day-by-day", spec=SPEC,
                        day_by_day=True)
    day_by_day_s = time.monotonic() - t0

    def rows(s: Settings) -> pa.Table:
        table = samples_table(get_catalog(s), s.namespace, spec).scan(selected_fields=tuple(spec.sample_columns)).to_arrow()
        return table.sort_by([("sample_id", "ascending")])

    ranged, daily = rows(settings), rows(by_day)
    differ = [c for c in spec.sample_columns if not ranged.column(c).equals(daily.column(c))]
    return {"day_by_day_s": round(day_by_day_s, 1), "compared_rows": ranged.num_rows,
            "same_rows": ranged.num_rows == daily.num_rows and not differ, "columns_that_differ": differ}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
