"""`slipstream bench freshness --json`: what real-time training is worth, and how fresh it is.

- Refresh cadence, on the drift scenario (the demo's data: 3 days x 20,000 impressions, 6 hours of
  stream, the hidden click model changes at T; `--spec criteo|ratings`: that spec's stationary
  generated data): the trainer's batch phase (a real run), then the
  trainer's stream step over the stream in event-time order; every stream row is scored by the
  model a service refreshing every minute, every hour and once a day would serve at its event time
  (`bench.support.refresh`). `auc_refresh_1min`, `auc_refresh_1h`, `auc_refresh_1d` on the same
  rows, each with its 95% interval (bootstrap over users), and `refresh_lift_ci_low`: the lower
  bound of AUC(1 minute) − AUC(1 day). The baseline is the daily refresh, measured in the same run.
- Event → exported model: a continuous trainer (`data.stop.mode=continuous`, an export every few
  seconds) tails a topic a producer writes live (event time = the clock) at `--rate` records/s;
  `event_to_export_p50_s` / `event_to_export_p99_s` are the seconds from an event to the export of
  the first model trained on it (`RunMetrics.freshness`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import threading
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.support.refresh import simulate
from bench.train import fill_samples
from slipstream.dev.datagen import GeneratorConfig, generates, reference_samples
from slipstream.dev.stack import free_port, start_kafka
from slipstream.pipeline.run_metrics import parse_run_metrics
from slipstream.processes import stop_process
from slipstream.samples.schema import is_holdout
from slipstream.samples.spec import load_spec
from slipstream.scoring import UserBootstrap
from slipstream.stream.kafka import create_topic, produce_samples
from trainers.config.schema import load_config

log = logging.getLogger("bench.freshness")

CADENCES_S = {"1min": 60, "1h": 3600, "1d": 86400}
SIZED = ["model.buckets.user_id=4001", "model.buckets.item_id=1009"]


def _round(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), 4)


def cadence_scores(root: Path, spec_name: str, days: int, per_day: int, stream_minutes: float, epochs: int) -> dict[str, Any]:
    """The refresh cadences on the drift scenario, or on another spec's generated (stationary) data
    (see the module docstring)."""
    from trainers.data.rows import SOURCE_ICEBERG, SOURCE_KAFKA, RowLayout, Rows
    from trainers.eval.online import StreamEvaluator
    from trainers.parallel.dist import init_distributed
    from trainers.step import Stepper
    from trainers.train import run

    spec = load_spec(spec_name)
    gen: Any
    if generates(spec):
        gen = GeneratorConfig(start_day=date(2026, 11, 1), days=days, impressions_per_day=per_day, seed=7, fmt="parquet",
                              stream_minutes=stream_minutes, drift=True)
        settings, snapshot, data = fill_samples(root, gen, row_group_rows=10_000)
        window = pa.concat_tables(list(reference_samples(gen).values()))  # the table's rows, as fill_samples wrote them
        sized = SIZED
    else:
        from bench.model_quality import fill_spec_samples
        from slipstream.dev.specgen import SpecGenConfig

        gen = SpecGenConfig(start_day=date(2026, 11, 1), days=days, events_per_day=per_day, seed=7, fmt="parquet",
                            stream_minutes=stream_minutes)
        settings, snapshot, data = fill_spec_samples(root, spec, gen, row_group_rows=10_000)
        window = pa.concat_tables(list(data.batch.values()))
        sized = []
    cfg = load_config(None, [f"data.snapshot_id={snapshot}", f"data.t_handoff={gen.t_handoff.isoformat()}",
                             f"data.window_days={days}", "data.stream=false", f"data.epochs={epochs}", "run.run_id=batch",
                             "run.checkpoint_every_s=0", "run.tensorboard=false", *sized], settings)
    started = time.perf_counter()
    run(cfg, settings)  # the batch phase, validation and early stopping as the trainer does them
    batch_s = time.perf_counter() - started
    import torch

    d = init_distributed("cpu")
    stepper = Stepper(cfg, d, spec)
    blob = torch.load(cfg.run.run_dir / "export" / "model.pt", map_location="cpu", weights_only=True)
    stepper.model.load_state_dict(blob["state_dict"])
    stepper.set_lr("stream")
    layout = RowLayout.from_spec(spec)
    t_us = int(gen.t_handoff.timestamp() * 1_000_000)
    day_us = 86_400_000_000
    stream = data.stream.filter(pc.greater_equal(pc.cast(data.stream.column("event_time"), pa.int64()), t_us))
    stream = stream.filter(pa.array(~is_holdout(stream.column("sample_id"))))  # the rows a trainer trains
    us = pc.cast(window.column("event_time"), pa.int64()).to_numpy()
    keep = ~is_holdout(window.column("sample_id"))
    replay = Rows.from_arrow(window.filter(pa.array(keep & (us >= t_us - 2 * day_us) & (us < t_us - day_us))), layout,
                             source=SOURCE_ICEBERG)  # the last training day (the trainer's replay window)
    reference = Rows.from_arrow(window.filter(pa.array(keep & (us >= t_us - day_us))), layout, source=SOURCE_ICEBERG)
    online = StreamEvaluator(spec, d.device, 1_000_000, 0, 1, 0, layout)
    dc = cfg.data
    fresh = max(1, dc.stream_batch_size - int(round(dc.stream_batch_size * dc.replay_share)))
    started = time.perf_counter()
    got = simulate(stepper, online, Rows.from_arrow(stream, layout, source=SOURCE_KAFKA), replay, reference, CADENCES_S,
                   t_us, fresh, dc.stream_batch_size - fresh)
    boot = UserBootstrap(got["label"], got["user"])
    out: dict[str, Any] = {"spec": spec.name, "drift": generates(spec), "rows": int(len(got["label"])), "users": boot.users,
                           "batch_phase_s": round(batch_s, 1),
                           "stream_s": round(time.perf_counter() - started, 1)}
    for name in CADENCES_S:
        e = boot.auc(got[name])
        out[f"auc_refresh_{name}"], out[f"auc_refresh_{name}_ci"] = _round(e.value), [_round(e.lo), _round(e.hi)]
    for fresher, staler in (("1min", "1d"), ("1h", "1d"), ("1min", "1h")):
        e = boot.diff(got[fresher], got[staler])
        out[f"refresh_lift_{fresher}_vs_{staler}"] = _round(e.value)
        out[f"refresh_lift_{fresher}_vs_{staler}_ci"] = [_round(e.lo), _round(e.hi)]
    out["refresh_lift_ci_low"] = out["refresh_lift_1min_vs_1d_ci"][0]
    return out


def live_latency(root: Path, bootstrap: str, seconds: float, rate: float, export_every_s: float) -> dict[str, Any]:
    """Event → exported model on a live stream (see the module docstring)."""
    from trainers.train import run

    now = datetime.now(UTC)
    per_day = 20_000
    # enough distinct stream rows for the whole run (a row produced twice would be scored after its twin trained)
    minutes = max(60.0, 1.2 * rate * seconds * 1440 / per_day)
    gen = GeneratorConfig(start_day=(now - timedelta(days=1)).date(), days=1, impressions_per_day=per_day, seed=3,
                          fmt="parquet", stream_minutes=minutes)
    settings, snapshot, data = fill_samples(root, gen, row_group_rows=2_000)
    topic = "live"
    create_topic(bootstrap, topic, 2)
    t = now.replace(microsecond=0)
    cfg = load_config(None, [f"data.snapshot_id={snapshot}", f"data.t_handoff={t.isoformat()}", "data.window_days=1",
                             "data.validation_days=0", "data.epochs=1", f"data.bootstrap={bootstrap}", f"data.topic={topic}",
                             "data.stop.mode=continuous", f"data.stop.export_every_min={export_every_s / 60}",
                             f"data.stop.timeout_s={seconds}", "data.max_lateness_s=5", "data.stream_shuffle_buffer=64",
                             "run.run_id=live", "run.checkpoint_every_s=0", "run.tensorboard=false", *SIZED], settings)
    rows = data.stream
    stop = threading.Event()
    sent = [0]

    def produce() -> None:
        """`rate` records a second, event time = the clock, the generated rows over and over (each
        round's sample ids made new)."""
        i, every = 0, 0.25
        per = max(1, int(rate * every))
        while not stop.is_set():
            at = time.monotonic()
            idx = np.arange(i, i + per) % rows.num_rows
            chunk = rows.take(pa.array(idx))
            ids = pc.binary_join_element_wise(chunk.column("sample_id"), pa.array([f"-r{j // rows.num_rows}"
                                                                                    for j in range(i, i + per)]), "")
            stamp = pa.array(np.full(per, int(time.time() * 1_000_000)), pa.timestamp("us", tz="UTC"))
            chunk = chunk.set_column(chunk.column_names.index("event_time"), "event_time", stamp)
            chunk = chunk.set_column(chunk.column_names.index("sample_id"), "sample_id", ids)
            produce_samples(bootstrap, topic, chunk, progress_every=0)
            sent[0] += per
            i += per
            time.sleep(max(0.0, every - (time.monotonic() - at)))

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    try:
        m = parse_run_metrics(run(cfg, settings))
    finally:
        stop.set()
        worker.join(30)
    f = m.freshness
    return {"produced": sent[0], "trained": m.samples_kafka, "exports": f.exports, "export_every_s": export_every_s,
            "event_to_export_p50_s": _round(f.event_to_export_s_p50), "event_to_export_p99_s": _round(f.event_to_export_s_p99),
            "consume_to_train_ms_p99": _round(f.consume_to_train_ms_p99),
            **_live_keys(f.live_prequential)}


def _live_keys(live: Any) -> dict[str, Any]:
    """The live model's prequential AUC over the rows since its previous export, with rows and interval."""
    m = live.model if live is not None else None
    return {"live_prequential_rows": live.rows if live is not None else 0,
            "live_prequential_auc": _round(m.auc) if m is not None else None,
            "live_prequential_auc_ci": [_round(m.lo), _round(m.hi)] if m is not None and m.has_interval else None}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="slipstream bench freshness")
    p.add_argument("--spec", default="synthetic", help="a shipped spec's name or a spec file (others than synthetic: "
                   "their stationary generator; the live latency runs on the synthetic spec)")
    p.add_argument("--days", type=int, default=3, help="batch days of the drift scenario")
    p.add_argument("--per-day", type=int, default=20_000, help="impressions per day")
    p.add_argument("--stream-minutes", type=float, default=360.0, help="event time the stream covers after T")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--live-seconds", type=float, default=60.0, help="how long the continuous trainer tails the live topic")
    p.add_argument("--rate", type=float, default=100.0, help="live records per second")
    p.add_argument("--export-every-s", type=float, default=6.0)
    args = p.parse_args([a for a in (argv or []) if a not in ("--json", "--")])
    logging.basicConfig(level=logging.WARNING)
    log.setLevel(logging.INFO)
    out: dict[str, Any] = {"benchmark": "freshness", "load_avg_1m_before": round(os.getloadavg()[0], 2),
                           "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="bench-freshness-") as tmp:
        root = Path(tmp)
        out["cadence"] = cadence_scores(root / "cadence", args.spec, args.days, args.per_day, args.stream_minutes, args.epochs)
        log.info("cadence: %s", out["cadence"])
        if args.live_seconds > 0:
            svc = start_kafka(root, free_port())
            try:
                out["live"] = live_latency(root / "live", svc.address, args.live_seconds, args.rate, args.export_every_s)
            finally:
                stop_process(svc.pid)
    out.update({k: out["cadence"][k] for k in ("auc_refresh_1min", "auc_refresh_1h", "auc_refresh_1d", "refresh_lift_ci_low")})
    out["event_to_export_p99_s"] = out["live"]["event_to_export_p99_s"] if "live" in out else None
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
