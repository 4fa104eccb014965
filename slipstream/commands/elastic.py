"""`slipstream elastic start|join|activate|leave|stop|status RUN_ID`: an elastic training job on this
machine, grown and shrunk by hand (what nodes joining and leaving a cluster job do).

`start` runs the job's first launcher here, in the foreground, until the job ends (its exit status
is the job's); `join` adds a launcher in the background (`--standby`: it loads its code and waits
for `activate`); `leave` takes one away (SIGTERM: every rank stops at the next step boundary after
a checkpoint, and the rest go on); `stop` stops them all (resumable: `start` again); `status` lists
the launchers and the worlds the run trained on.
See slipstream.pipeline.elastic and docs/cluster.md (Elastic training).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from slipstream.errors import ConfigError
from slipstream.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("elastic", help="an elastic training job on this machine: start it, add or remove launchers")
    esub = p.add_subparsers(dest="elastic_command", required=True)
    start = esub.add_parser("start", help="run the job's first launcher here, until the job ends")
    start.add_argument("run_id", help="the run (its folder under SLIPSTREAM_RUNS_DIR holds the job's launchers)")
    start.add_argument("--max-nodes", type=int, required=True, help="the most launchers that may join (MAX)")
    start.add_argument("--min-nodes", type=int, default=1, help="the fewest the job goes on with (MIN, default 1)")
    start.add_argument("--nproc-per-node", type=int, default=1, help="training processes per launcher (default 1)")
    start.add_argument("--max-restarts", type=int, default=3,
                       help="worker restarts per launcher after a failure or a launcher leaving (default 3)")
    start.add_argument("--stop-grace-s", type=int, default=60,
                       help="seconds the workers have to commit a checkpoint after SIGTERM (default 60)")
    start.add_argument("--standby", action="store_true",
                       help="load the workers' code, then wait for `activate` before training")
    what = start.add_mutually_exclusive_group(required=True)
    what.add_argument("--plan", help="the run's plan.json")
    what.add_argument("--config", help="a trainer config file (trainers/config/example.yaml)")
    start.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a trainer setting (repeatable)")
    start.set_defaults(func=start_job)
    join = esub.add_parser("join", help="add a launcher of the running job (in the background)")
    join.add_argument("run_id")
    join.add_argument("--standby", action="store_true", help="load the workers' code, then wait for `activate` to join")
    join.set_defaults(func=join_job)
    activate = esub.add_parser("activate", help="let standby launchers join")
    activate.add_argument("run_id")
    activate.add_argument("--launcher", type=int, help="only this one (default: every standby launcher)")
    activate.set_defaults(func=activate_job)
    leave = esub.add_parser("leave", help="remove a launcher that joined (SIGTERM: a graceful stop, then the rest go on)")
    leave.add_argument("run_id")
    leave.add_argument("--launcher", type=int, help="its number (default: the newest running one)")
    leave.add_argument("--wait-s", type=float, default=0.0, help="wait up to this long for it to exit")
    leave.set_defaults(func=leave_job)
    stop = esub.add_parser("stop", help="stop every launcher (a graceful stop; `start` resumes the run)")
    stop.add_argument("run_id")
    stop.set_defaults(func=stop_job)
    status = esub.add_parser("status", help="the job's launchers and the worlds the run trained on")
    status.add_argument("run_id")
    status.add_argument("--json", action="store_true", help="print it as JSON")
    status.set_defaults(func=job_status)


def _run_path(run_id: str) -> Path:
    from slipstream.pipeline.runlayout import run_dir

    return run_dir(Settings.from_env(), run_id)


def start_job(args: argparse.Namespace) -> int:
    from slipstream.pipeline import elastic
    from slipstream.pipeline.jobspec import TrainJobSpec
    from slipstream.pipeline.runplan import read_plan

    overrides = dict(o.split("=", 1) for o in args.overrides if "=" in o)
    if len(overrides) != len(args.overrides):
        raise ConfigError(f"--set takes SECTION.KEY=VALUE, got {args.overrides!r}")
    if args.plan:
        planned = read_plan(Path(args.plan)).run_id
        if planned != args.run_id:
            raise ConfigError(f"the plan {args.plan} is run {planned!r}, not {args.run_id!r}")
    else:
        overrides["run.run_id"] = args.run_id
    spec = TrainJobSpec(run_id=args.run_id, plan_path=str(Path(args.plan).absolute()) if args.plan else "",
                        config_path=str(Path(args.config).absolute()) if args.config else "", overrides=overrides,
                        cpu_processes=args.nproc_per_node, nnodes=args.min_nodes, min_nodes=args.min_nodes,
                        max_nodes=args.max_nodes, max_restarts=args.max_restarts, stop_grace_s=args.stop_grace_s)
    if not spec.elastic:
        raise ConfigError(f"--max-nodes ({args.max_nodes}) must be above --min-nodes ({args.min_nodes}) for an elastic job")
    run_path = _run_path(args.run_id)
    running = [launcher.index for launcher in elastic.launchers(run_path) if launcher.alive]
    if running:
        raise elastic.ElasticError(f"run {args.run_id} already has launchers {running} running: "
                                   f"`slipstream elastic join {args.run_id}` adds one")
    argv = spec.torchrun_args(rdzv_host=elastic.LOOPBACK, rdzv_port=elastic.free_loopback_port())
    command = elastic.local_launch_command(run_path, argv, standby=args.standby)
    print(f"run {args.run_id}: launcher 0, rendezvous on {elastic.LOOPBACK}; "
          f"`slipstream elastic join {args.run_id}` adds launchers (up to {args.max_nodes})", flush=True)
    os.execv(command[0], command)  # this process becomes launcher 0: signals and exit status are its own


def join_job(args: argparse.Namespace) -> int:
    from slipstream.pipeline import elastic

    launcher = elastic.join(_run_path(args.run_id), standby=args.standby)
    print(json.dumps(asdict(launcher)))
    return 0


def activate_job(args: argparse.Namespace) -> int:
    from slipstream.pipeline import elastic

    started = elastic.activate(_run_path(args.run_id), args.launcher)
    print(json.dumps({"joining": [launcher.index for launcher in started]}))
    return 0


def leave_job(args: argparse.Namespace) -> int:
    from slipstream.pipeline import elastic

    launcher = elastic.leave(_run_path(args.run_id), args.launcher, wait_s=args.wait_s)
    print(json.dumps({"left": launcher.index, "pid": launcher.pid, "running": launcher.alive}))
    return 0


def stop_job(args: argparse.Namespace) -> int:
    from slipstream.pipeline import elastic

    stopped = elastic.stop(_run_path(args.run_id))
    print(json.dumps({"stopping": [launcher.index for launcher in stopped]}))
    return 0


def job_status(args: argparse.Namespace) -> int:
    from slipstream.pipeline import elastic

    run_path = _run_path(args.run_id)
    launchers = elastic.launchers(run_path)
    worlds = [e for e in elastic.read_worlds(run_path) if e.get("event") in ("start", "stop")]
    if args.json:
        print(json.dumps({"launchers": [{**asdict(launcher), "running": launcher.alive} for launcher in launchers],
                          "worlds": worlds}, indent=2))
        return 0
    print(f"run {args.run_id}: {sum(launcher.alive for launcher in launchers)} launcher(s) running")
    for launcher in launchers:
        state = ("standby" if launcher.standby and not launcher.joined else "running") if launcher.alive \
            else (f"exited {launcher.exit_code}" if launcher.ended else "gone")
        print(f"  launcher {launcher.index:<3} {launcher.addr:<12} pid {launcher.pid:<8} {state:<12} {launcher.log}")
    for e in worlds:
        when = time.strftime("%H:%M:%S", time.localtime(float(e["time"])))
        what = (f"world of {e['world']} started at step {e['step']} ({e['phase']})" if e["event"] == "start"
                else f"world of {e['world']} stopped gracefully at step {e['step']}")
        print(f"  {when} {what}")
    return 0
