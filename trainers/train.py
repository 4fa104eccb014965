"""Entry point: `torchrun --nproc-per-node N -m trainers.train --plan PLAN [--config FILE] [--set k=v ...]`.

`--plan` takes the run's ids, data (snapshot, window, T, files) and knobs from the plan its render
step wrote (`trainers.config.plan`); without it, `--config`/`--set` name everything and the trainer plans
the run itself. Also runs without torchrun as a world of one (`python -m trainers.train ...`).
Writes the run folder (docs/trainer.md, Run layout) and exits 0 when the run finished,
2 on an error Slipstream explains (one line on stderr naming the file, offset or partition and
what to do; a rank that stopped because another one failed says so), 3 when SIGTERM or SIGINT
stopped it gracefully (every rank committed a checkpoint at the same step boundary: run it again to
resume; torchrun's elastic agent does), 1 on any other failure.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from slipstream.errors import SlipstreamError
from slipstream.pipeline.runplan import RunPlan, plan_path
from slipstream.samples.spec import load_spec
from slipstream.settings import Settings
from trainers.config.plan import load_plan_config
from trainers.config.schema import TrainConfig, load_config
from trainers.parallel.graceful_stop import EXIT_STOPPED, GracefulStop
from trainers.parallel.graceful_stop import REQUEST as STOP_REQUEST

log = logging.getLogger("trainers.train")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trainers.train", description=__doc__.splitlines()[0])
    p.add_argument("--plan", help="the run's plan.json (in its run folder): run id, snapshot, window, T, files, knobs")
    p.add_argument("--config", help="YAML or JSON file with sections data, model, optim, run")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one field (repeatable), e.g. --set data.snapshot_id=123")
    return p.parse_args(argv)


def run(cfg: TrainConfig, settings: Settings, open_file: Any = None, plan: RunPlan | None = None,
        plan_file: Path | None = None) -> dict[str, Any]:
    """Train as configured (collective over the torchrun world); returns the summary on rank 0.
    `plan`: the run's plan (from `plan_file`); None: planned here from the config."""
    from trainers.finish import finish, finished_summary
    from trainers.parallel.dist import init_distributed
    from trainers.parallel.failure import forget_earlier, settle
    from trainers.trainer import Trainer

    started = time.monotonic()
    spec = plan.spec if plan is not None else load_spec(settings.spec)
    d = init_distributed(cfg.run.device, cpu_affinity=cfg.run.cpu_affinity)
    tr = None
    try:
        if d.is_main:
            forget_earlier(cfg.run.run_dir)
        tr = Trainer(cfg, d, settings, spec, open_file)
        units = tr.setup(plan)
        if d.is_main:
            write_config(cfg, tr.plan, plan_file)
        resumed = tr.resume()
        st = tr.state
        tr.worlds.started(st.step, st.phase, st.epoch, resumed)
        if tr.stop_agreed():  # signalled while this world formed: it has trained nothing to commit
            raise GracefulStop(st.step, st.last_checkpoint, 0)
        if resumed and st.phase == "done" and (done := finished_summary(cfg.run.run_dir)) is not None:
            log.info("run %s already finished at step %d: its metrics.json stays as it is", cfg.run.run_id, st.step)
            tr.metrics.close()
            return done if d.is_main else {}
        if st.phase == "batch":
            tr.batch_phase(units)
            if cfg.data.stream:
                tr.handoff()
        if st.phase == "stream":
            tr.stream_phase()
        if st.phase != "done":
            st.phase = "done"
            tr.checkpoint()
        summary = finish(tr.outcome(units), d, tr.metrics, time.monotonic() - started)
        tr.metrics.close()
        return summary
    except Exception as e:
        # recorded before the process group closes, so the other ranks can name this one
        peer = settle(e, cfg.run.run_dir, d.rank, d.world)
        if peer is not None:
            raise peer from None
        raise
    finally:
        # The DDP model (its reducer holds the process group and gradient buckets) and the data
        # sources go first, while the process group and the interpreter are alive: C++ threads
        # left to interpreter finalization can abort the process after the work is done.
        del tr
        gc.collect()
        d.close()


def write_config(cfg: TrainConfig, plan: RunPlan | None, plan_file: Path | None) -> None:
    """`config.json`: the resolved config and the plan it trains (its snapshot and T)."""
    cfg.run.run_dir.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = cfg.to_dict()
    if plan is not None:
        record["plan"] = {"path": str(plan_file or plan_path(cfg.run.run_dir)), "run_id": plan.run_id,
                          "snapshot_id": plan.snapshot_id, "t_handoff": plan.t_handoff.isoformat(),
                          "window_start": plan.window_start.isoformat(), "files": len(plan.files), "rows": plan.rows,
                          "spec": {"name": plan.spec.name, "version": plan.spec.version, "digest": plan.spec.digest}}
    (cfg.run.run_dir / "config.json").write_text(json.dumps(record, indent=2))


def main(argv: list[str] | None = None) -> int:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, force=True,  # a forked worker's too
                        format=f"%(asctime)s r{rank} %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    STOP_REQUEST.install()
    try:
        settings = Settings.from_env()
        if args.plan:
            plan, cfg = load_plan_config(args.plan, args.config, args.overrides, settings)
            summary = run(cfg, settings, plan=plan, plan_file=Path(args.plan).absolute())
        else:
            summary = run(cfg=load_config(args.config, args.overrides, settings), settings=settings)
    except SlipstreamError as e:
        from trainers.parallel.failure import one_line

        who = f"rank {rank}: " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
        print(f"trainers.train: {who}{one_line(e)}", file=sys.stderr)
        return 2
    except GracefulStop as e:
        log.warning("%s; exit %d: run it again to resume", e, EXIT_STOPPED)
        return EXIT_STOPPED
    if rank == 0:
        keys = ("samples_iceberg", "samples_kafka", "dropped_before_t", "dead_letters", "auc", "auc_lo", "auc_hi",
                "auc_rows", "auc_on", "samples_per_s", "checkpoint")
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


def worker(*argv: str) -> None:
    """The trainer as a function, for launchers that start workers as forks of a process that
    has already imported it (trainers.launch). A non-zero status leaves as SystemExit, which
    torch's process context reports to the agent as a failed worker."""
    code = main(list(argv))
    logging.shutdown()
    if code:
        sys.exit(code)


if __name__ == "__main__":
    exit_worker(main())
