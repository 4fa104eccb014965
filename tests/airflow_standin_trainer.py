"""A tiny stand-in for `trainers.train`, for the tests of the launcher itself (killing a training
process tree, a failing rank, a run that never ends) where the real trainer's work is beside the point.

It honours the trainer's command-line contract (`--plan P`, `--config F`, `--set section.key=value`:
the plan's ids, snapshot, T, cache folder and knobs first, then the `--set` pairs), really runs
under torchrun (a gloo process group, one all_reduce across ranks) and writes the run layout
(docs/trainer.md, Run layout) from rank 0. `--set standin.sleep_s=N` makes it wait (to test killing it);
`--set standin.auc=X` sets the AUC it reports (on the forward tail; its baseline's is 0.6, each difference
±0.01); `--set standin.fail=true` exits 3.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def plan_settings(path: str) -> dict[str, str]:
    """The trainer settings a plan fixes, as the `--set` strings the stand-in records."""
    from slipstream.pipeline.request import trainer_overrides
    from slipstream.pipeline.runplan import read_plan

    plan = read_plan(Path(path))
    out = {"run.run_id": plan.run_id, "data.snapshot_id": str(plan.snapshot_id), "data.t_handoff": plan.t_handoff.isoformat(),
           "data.cache_dir": plan.cache_dir}
    out.update({k: str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in (trainer_overrides(plan.request) if plan.request else {}).items()})
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--plan", default=None)
    p.add_argument("--config", default=None)
    p.add_argument("--set", dest="sets", action="append", default=[])
    args = p.parse_args()
    cfg = plan_settings(args.plan) if args.plan else {}
    cfg.update(dict(s.split("=", 1) for s in args.sets))
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    deadline = time.monotonic() + float(cfg.get("standin.sleep_s", 0))
    while time.monotonic() < deadline:
        time.sleep(0.1)
    if cfg.get("standin.fail") == "true":
        return 3
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)  # every rank took part
    if rank == 0:
        run_id = cfg["run.run_id"]
        run = Path(os.environ["SLIPSTREAM_RUNS_DIR"]) / run_id
        (run / "checkpoint" / "step-1").mkdir(parents=True, exist_ok=True)
        (run / "checkpoint" / "latest").write_text("step-1")
        (run / "export").mkdir(exist_ok=True)
        torch.save({"w": torch.zeros(3)}, run / "export" / "model.pt")
        (run / "export" / "model.json").write_text(json.dumps({"schema_version": 1, "config": cfg}))
        (run / "config.json").write_text(json.dumps(cfg, indent=2))
        from tests.metrics_fixtures import run_metrics, scored_set

        # judged like a real run: scores on the forward tail after T, its baseline's on the same rows
        metrics = run_metrics(
            run_id, forward_tail=scored_set(float(cfg.get("standin.auc", 0.75)), baseline=0.6, rows=200, users=80),
            snapshot_id=int(cfg.get("data.snapshot_id", 0)), t_handoff=cfg.get("data.t_handoff"),
            samples_iceberg=100, samples_kafka=10, dropped_before_t=0, dead_letters=0,
            handoff_offsets={"0": 5}, final_offsets={"0": 15}, samples_per_s=1000.0, data_wait_share=0.1,
            world_size=world, checkpoint=str(run / "checkpoint" / "step-1"),
        )
        (run / "metrics.json").write_text(metrics.to_json())
        (run / "standin.json").write_text(json.dumps({"rank_sum": float(t.item())}))  # both ranks took part
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
