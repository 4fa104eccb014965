"""`slipstream bench train --json`: samples/s of the trainer's batch phase vs two baselines.

All in one process on a generated `samples` table (SQLite catalog in a temp folder):
- `trainer`: `trainers.train.run` over the window (world of one, batch phase only, the real
  loop: Iceberg read, shuffle, prefetch, DDP-free step, checkpoints, audit, evaluation after);
- `loader_only`: the same IcebergSource iterated without training (the data pipeline's ceiling);
- `compute_only`: the same number of steps on batches already in memory (the model's ceiling).
`vs_compute_only` near 1 means the data pipeline hides behind compute; `data_wait_share` is
the trainer's own measure of time spent waiting for data. Held-out AUC is reported next to the
generator's best achievable AUC on the same slice.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

from slipstream.dev.datagen import GeneratedData, GeneratorConfig, generate, reference_samples, write_manifest
from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.lake.planning import plan_window_files
from slipstream.samples.schema import DEFAULT_SPEC
from slipstream.settings import Settings
from trainers.config.schema import load_config
from trainers.data.iceberg_source import IcebergSource
from trainers.data.rows import Features, Rows
from trainers.data.units import file_opener, plan_units
from trainers.models import build_model
from trainers.optim.groups import build_optimizer

log = logging.getLogger(__name__)


def fill_samples(home: Path, gen: GeneratorConfig, row_group_rows: int) -> tuple[Settings, int, GeneratedData]:
    """A `samples` table (SQLite catalog under home) with gen's batch days, the generated stream
    and the generator's manifest (its best achievable AUC) where the trainer looks for it."""
    settings = Settings(home=home)
    table = samples_table(get_catalog(settings), settings.namespace)
    with table.transaction() as tx:
        tx.set_properties({"write.parquet.row-group-limit": str(row_group_rows)})
    for day in reference_samples(gen).values():
        table.append(day)
    data = generate(gen, home / "raw")
    write_manifest(data, home / "generator" / "manifest.json")
    snap = get_catalog(settings).load_table(settings.table).current_snapshot()
    assert snap is not None
    return settings, snap.snapshot_id, data


def _compute_only(cfg: Any, feats: list[Features], epochs: int, batch_size: int) -> float:
    model = build_model(DEFAULT_SPEC, cfg.model, 0)
    opt = build_optimizer(model, cfg.optim.name, cfg.optim.lr, 0.0)
    t0 = time.perf_counter()
    for _ in range(epochs):
        for f in feats:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(f), f.label, reduction="sum") / batch_size
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
            opt.step()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="slipstream bench train")
    p.add_argument("--days", type=int, default=2)
    p.add_argument("--per-day", type=int, default=60_000)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--row-group-rows", type=int, default=10_000)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch default)")
    p.add_argument("--home", default="", help="work folder (default: a temp folder)")
    # the bench runner passes everything after the name through, its own --json included
    args = p.parse_args([a for a in (argv or []) if a not in ("--json", "--")])
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        home = Path(args.home or tmp)
        gen = GeneratorConfig(start_day=date(2026, 11, 1), days=args.days, impressions_per_day=args.per_day, seed=11,
                              fmt="parquet", stream_minutes=10.0)
        settings, snapshot, _ = fill_samples(home, gen, args.row_group_rows)
        cfg = load_config(None, [
            f"data.snapshot_id={snapshot}", f"data.t_handoff={gen.t_handoff.isoformat()}",
            f"data.window_days={args.days}", "data.stream=false", f"data.batch_size={args.batch_size}",
            f"data.epochs={args.epochs}", "run.run_id=bench", "run.checkpoint_every_steps=1000000",
            "run.checkpoint_every_s=0", f"run.num_threads={args.threads}",
            # tables sized to the generator's id space (2,000 users, 400 items)
            "model.buckets.user_id=4001", "model.buckets.item_id=1009", "model.buckets.device_hash=1031",
            "model.buckets.country_hash=1031", "model.buckets.category_hash=1031",
        ], settings)
        table = get_catalog(settings).load_table(settings.table)
        plan = plan_window_files(table, snapshot, cfg.data.window_start, cfg.data.t_handoff)
        open_file, _ = file_opener(table.io, None)
        units = plan_units(plan, open_file)
        t_us = int(gen.t_handoff.timestamp() * 1e6)
        src = IcebergSource(units, open_file, rank=0, world=1, seed=0, batch_size=args.batch_size,
                            shuffle_rows=cfg.data.shuffle_buffer, window_us=(int(cfg.data.window_start.timestamp() * 1e6), t_us))
        batches: list[Rows] = []
        t0 = time.perf_counter()
        src.start_epoch(0)
        while (b := src.next_batch()) is not None:
            batches.append(b)
        loader_s = time.perf_counter() - t0
        src.close()
        rows_per_epoch = sum(len(b) for b in batches)
        feats = [Features.from_rows(b) for b in batches]

        # The machine may be shared: measure the compute ceiling before and after the trainer.
        compute_s = [_compute_only(cfg, feats, args.epochs, args.batch_size)]
        from trainers.train import run

        started = time.perf_counter()
        summary = run(cfg, settings)
        trainer_wall = time.perf_counter() - started
        compute_s.append(_compute_only(cfg, feats, args.epochs, args.batch_size))
    compute_rate = rows_per_epoch * args.epochs / (sum(compute_s) / len(compute_s))
    trainer_rate = float(summary["samples_per_s"])
    return {
        "benchmark": "train",
        "device": summary["device"], "world_size": summary["world_size"], "torch_threads": torch.get_num_threads(),
        "rows_per_epoch": rows_per_epoch, "epochs": args.epochs, "batch_size": args.batch_size,
        "trainer_samples_per_s": round(trainer_rate, 1),
        "data_wait_share": round(float(summary["data_wait_share"]), 4),
        "loader_only_samples_per_s": round(rows_per_epoch / loader_s, 1),
        "compute_only_samples_per_s": round(compute_rate, 1),
        "vs_compute_only": round(trainer_rate / compute_rate, 3),
        "compute_only_s_before_after": [round(x, 2) for x in compute_s],
        "trainer_wall_s_incl_eval": round(trainer_wall, 2),
        **_holdout_before_t(summary),
    }


def _holdout_before_t(summary: dict[str, Any]) -> dict[str, Any]:
    """The model's scores on the held-out rows before T, with their rows and interval."""
    held = (summary.get("evaluation") or {}).get("holdout_before_t") or {}
    model, best = held.get("model") or {}, held.get("best") or {}
    return {"auc_before_t": model.get("auc"), "auc_before_t_ci": [model.get("lo"), model.get("hi")],
            "auc_before_t_rows": held.get("rows", 0), "best_auc_before_t": best.get("auc"),
            "logloss_before_t": model.get("logloss")}


if __name__ == "__main__":
    print(json.dumps(main()))
