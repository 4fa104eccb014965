"""`python -m trainers.launch [--job-dir D --node-index N] -- <torchrun arguments> -m trainers.train ...`

torchrun for the trainer: torch's own argument parser, launcher and elastic agent, with three
differences that matter when a job changes size while it runs (slipstream.pipeline.elastic):

- Warm workers. The trainer's code (torch, TorchRec, pyarrow...) is imported once, by a
  multiprocessing forkserver started before this node joins the rendezvous, and every worker is a
  fork of it. torch's agent restarts all workers at every membership change: a restart costs a
  fork, not a fresh interpreter importing torch (seconds of CPU per worker, tens of seconds on a
  loaded machine), and a joining node is ready before it makes the others stop.
- Loopback. With a rendezvous on a loopback address, launcher 0 hosts the rendezvous store itself,
  listening on that address only (torch's TCPStore binds every interface whatever host it is
  given; trainers.parallel.loopback), the workers' rank 0 does the same for their process group,
  and gloo is told to use the loopback interface. (The agents' shared store is off whatever the
  address: slipstream.pipeline.elastic.SHARED_STORE_OFF.)
- Records. With `--job-dir`, the launcher records itself (pid, address, when it was ready, how it
  ended) and launcher 0 writes the job that `slipstream elastic join` reads. With `--standby` it
  waits, loaded, for SIGUSR1 before it joins (`slipstream elastic activate`).

Exit status: 0 when the job finished, 1 when its workers failed past the restart budget, 128+N when
signal N stopped this launcher (after its workers' graceful stop), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from slipstream.pipeline.elastic import (
    SHARED_STORE_OFF,
    ElasticJob,
    Launcher,
    launcher_path,
    node_addr,
    shared_env,
    write_job,
    write_launcher,
)
from slipstream.pipeline.jobspec import TRAINER_MODULE
from trainers.parallel.dist import LAUNCHER_PID_ENV
from trainers.parallel.loopback import host_store, is_loopback

log = logging.getLogger("trainers.launch")

PRELOAD = ("trainers.train", "trainers.trainer", "trainers.finish", "torch.utils.tensorboard",
           "torchrec.distributed.model_parallel", "torchrec.distributed.planner", "torchrec.distributed.embeddingbag")
"""What the forkserver imports once for every worker it forks (a sharded model's TorchRec included)."""


def parse_own(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """This launcher's own options, and torchrun's arguments (everything after `--`)."""
    if "--" in argv:
        cut = argv.index("--")
        own, rest = argv[:cut], argv[cut + 1:]
    else:
        own, rest = [], argv
    p = argparse.ArgumentParser(prog="trainers.launch", description=__doc__.splitlines()[0])
    p.add_argument("--job-dir", default="", help="the elastic job's folder (<run>/elastic): record this launcher there")
    p.add_argument("--node-index", type=int, default=0, help="this launcher's number in the job (0: the first)")
    p.add_argument("--standby", action="store_true", help="once loaded, wait for SIGUSR1 before joining")
    return p.parse_args(own), rest


def warm_workers(modules: tuple[str, ...]) -> float:
    """Start the forkserver with `modules` imported, and wait until it is ready; returns seconds.
    Meanwhile this process imports what torch's log formatter imports the first time the agent
    logs a worker's exit (torch._dynamo: seconds, which would otherwise delay every shrink)."""
    t0 = time.monotonic()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(modules))
    probe = ctx.Process(target=time.sleep, args=(0,))
    probe.start()
    importlib.import_module("torch._dynamo")
    probe.join()
    return time.monotonic() - t0


class Go:
    """SIGUSR1, caught from the start (its default action would end the process): a standby's go."""

    def __init__(self) -> None:
        self.given = False
        signal.signal(signal.SIGUSR1, self._set)

    def _set(self, signum: int, frame: object) -> None:
        self.given = True

    def wait(self) -> None:
        while not self.given:
            time.sleep(0.05)


def _first_launcher_running(directory: Path) -> bool:
    from slipstream.pipeline.elastic import launchers

    return any(launcher.alive for launcher in launchers(directory.parent) if launcher.index == 0)


def _conf(text: str) -> dict[str, str]:
    pairs = (kv.split("=", 1) for kv in text.split(",") if "=" in kv)
    return {k.strip(): v.strip() for k, v in pairs if k.strip() != "is_host"}


def _record(directory: Path | None, index: int, **changes: Any) -> None:
    if directory is None:
        return
    path = launcher_path(directory, index)
    try:
        import json

        current = Launcher(**json.loads(path.read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        current = Launcher(index)
    write_launcher(directory, replace(current, **changes))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s launcher %(levelname)s %(name)s: %(message)s")
    own, torchrun_argv = parse_own(list(sys.argv[1:] if argv is None else argv))
    go = Go() if own.standby else None
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous  # noqa: F401  # its logger, below
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    for name in list(logging.root.manager.loggerDict):  # the agent's rendezvous rounds and restarts, in this log
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.INFO)
    args = parse_args(torchrun_argv)
    if not args.module or args.training_script != TRAINER_MODULE or args.standalone or args.rdzv_backend != "c10d":
        print(f"trainers.launch: give torchrun's c10d rendezvous arguments and `-m {TRAINER_MODULE}` (no --standalone: "
              "its stores listen on every interface)", file=sys.stderr)
        return 2
    host, _, port = args.rdzv_endpoint.rpartition(":")
    hosted: list[Any] = []
    if is_loopback(host):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if own.node_index == 0:  # the rendezvous store, on the loopback address only, for as long as this
            # launcher runs (the job's rendezvous ends with it); its own agent is a client like the others
            hosted.append(host_store(host, int(port), None, timedelta(seconds=60)))
        conf = _conf(args.rdzv_conf)
        args.rdzv_conf = ",".join([*(f"{k}={v}" for k, v in conf.items()), "is_host=false"])
    if args.master_port is None:
        args.master_port = 29500  # as torchrun does; unused by the c10d rendezvous
    config, _, _ = config_from_args(args)
    config.start_method = "forkserver"
    directory = Path(own.job_dir) if own.job_dir else None
    if directory is not None:  # the workers' error files with the job, not in a temporary folder
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

        config.logs_specs = DefaultLogsSpecs(log_dir=str(directory / "torchelastic" / f"launcher-{own.node_index}"))
    os.environ[SHARED_STORE_OFF[0]] = SHARED_STORE_OFF[1]  # see the module docstring
    # the workers' parent is the forkserver, which takes its environment from here as it starts:
    # they watch this process and end with it (trainers.parallel.dist.die_with_launcher)
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    _record(directory, own.node_index, pid=os.getpid(), addr=args.local_addr or node_addr(own.node_index),
            started=time.time(), standby=own.standby)
    warm_s = warm_workers(PRELOAD)
    from trainers.train import worker  # here too, before joining: importing it then would delay the others
    log.info("launcher %d: workers' code loaded in %.1fs; joining rendezvous %s at %s", own.node_index, warm_s,
             args.rdzv_id, args.rdzv_endpoint)
    if directory is not None and own.node_index == 0:
        write_job(directory, ElasticJob(
            endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id, nnodes=args.nnodes,
            nproc_per_node=int(args.nproc_per_node), max_restarts=args.max_restarts,
            shutdown_timeout_s=int(config.shutdown_timeout or 30), rdzv_conf=_conf(args.rdzv_conf),
            module=args.training_script, trainer_args=list(args.training_script_args), env=shared_env(os.environ)))
    _record(directory, own.node_index, ready=time.time())
    if go is not None:
        log.info("launcher %d: standing by until `slipstream elastic activate` (SIGUSR1)", own.node_index)
        go.wait()
    if directory is not None and own.node_index > 0 and not _first_launcher_running(directory):
        log.error("launcher %d: the job's first launcher is gone (the job ended or was stopped): not joining",
                  own.node_index)
        _record(directory, own.node_index, ended=time.time(), exit_code=1)
        return 1
    _record(directory, own.node_index, joined=time.time())

    code = 1
    try:
        elastic_launch(config, entrypoint=worker)(*args.training_script_args)
        code = 0
    except ChildFailedError as e:
        log.error("the workers failed past the restart budget (--max-restarts %d): %s", args.max_restarts, e)
    except SignalException as e:
        code = 128 + int(e.sigval)
        log.warning("launcher %d stopped by %s", own.node_index, e.sigval.name)
    finally:
        _record(directory, own.node_index, ended=time.time(), exit_code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
