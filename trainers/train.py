"""Entry point: `torchrun --nproc-per-node N -m trainers.train --config FILE [--set section.key=value ...]`.

Also runs without torchrun as a world of one (`python -m trainers.train ...`). Writes the run
layout of CONTRACTS.md under `<run.runs_dir>/<run.run_id>/` and exits 0 when the run finished,
2 on a configuration/resume error (message on stderr), 1 on any other failure.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
from typing import Any

from slipstream.errors import SlipstreamError
from slipstream.settings import Settings
from trainers.config import TrainConfig, load_config

log = logging.getLogger("trainers.train")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trainers.train", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="YAML or JSON file with sections data, model, optim, run")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one field (repeatable), e.g. --set data.snapshot_id=123")
    return p.parse_args(argv)


def run(cfg: TrainConfig, settings: Settings, open_file: Any = None) -> dict[str, Any]:
    """Train as configured (collective over the torchrun world); returns the summary on rank 0."""
    from trainers.distributed import init_distributed
    from trainers.finish import finish, finished_summary
    from trainers.trainer import Trainer

    started = time.monotonic()
    d = init_distributed(cfg.run.device)
    tr = None
    try:
        if d.is_main:
            cfg.run.run_dir.mkdir(parents=True, exist_ok=True)
            (cfg.run.run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        tr = Trainer(cfg, d, settings, open_file)
        units = tr.plan()
        rp = tr.resume()
        if rp is not None and rp.phase == "done" and (done := finished_summary(cfg.run.run_dir)) is not None:
            log.info("run %s already finished at step %d: its metrics.json stays as it is", cfg.run.run_id, rp.step)
            tr.metrics.close()
            return done if d.is_main else {}
        if tr.phase == "batch":
            tr.batch_phase(units, rp)
            if cfg.data.stream:
                tr.handoff()
        if tr.phase == "stream":
            tr.stream_phase()
        if tr.phase != "done":
            tr.phase = "done"
            tr.checkpoint()
        summary = finish(tr, units, time.monotonic() - started)
        tr.metrics.close()
        return summary
    finally:
        # The DDP model (its reducer holds the process group and gradient buckets) and the data
        # sources go first, while the process group and the interpreter are alive: C++ threads
        # left to interpreter finalization can abort the process after the work is done.
        del tr
        gc.collect()
        d.close()


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s r{rank} %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        settings = Settings.from_env()
        cfg = load_config(args.config, args.overrides, settings)
        summary = run(cfg, settings)
    except SlipstreamError as e:
        print(f"trainers.train: {e}", file=sys.stderr)
        return 2
    if rank == 0:
        keys = ("samples_iceberg", "samples_kafka", "dropped_before_t", "dead_letters", "auc", "auc_after_t",
                "auc_after_t_batch_only", "best_auc_after_t", "samples_per_s", "checkpoint")
        print(json.dumps({k: summary.get(k) for k in keys}, default=str))
    return 0


def exit_worker(code: int) -> None:
    """End a torchrun worker without interpreter finalization once its work is durable.

    Everything the run leaves (checkpoints, metrics, audit, export) is written, fsynced and closed
    by the time `main` returns; what finalization would still do is run C++ destructors of
    gloo, librdkafka and Arrow threads in an order none of them promises, and an abort there
    ("terminate called without an active exception") would turn a finished run into a failed
    one. Outside torchrun it is a plain exit."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_worker(main())
