"""Elastic jobs on one machine: the launchers of a running job, added and removed by hand.

An elastic job runs `torchrun --nnodes MIN:MAX` with a c10d rendezvous; every launcher (torchrun's
elastic agent, one per node) that meets there adds its processes to the world, and a launcher
that leaves takes them away. torch restarts every worker on each change and the trainer resumes
from the checkpoint the old world committed as it stopped (trainers.parallel.graceful_stop), with
its data re-dealt over the new world. On a cluster the nodes are pods (the PyTorchJob's
`elasticPolicy`); here they are processes of this machine, in the run folder's `elastic/`:

    elastic/job.json            the job: rendezvous endpoint and id, bounds, restart budget, the
                                trainer's arguments and environment (written by the first launcher)
    elastic/launchers/N.json    launcher N: its pid, rendezvous address, log, when it started,
                                when its workers' code was loaded, when it joined, how it ended
    elastic/launcher-N.log      a joined launcher's output (launcher 0's goes where it was started)
    elastic/torchelastic/launcher-N/   torch's per-attempt error files of launcher N's workers

A launcher loads its workers' code before it joins, so the running world goes on training
meanwhile; one started as a standby waits, loaded, until `activate` lets it join (a spare ready
for the moment capacity is lent). Launcher 0 is the job's first and hosts the rendezvous store:
it stays for the whole job (as worker 0 does on Kubernetes). Launcher N >= 1 joins as `127.0.0.(N+1)`: every address is on the
loopback interface, and the rendezvous, which orders nodes by address, keeps launcher 0 rank 0.
`trainers.launch` is the launcher; `slipstream elastic` (slipstream.commands.elastic) the commands.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slipstream.errors import ConfigError, SlipstreamError
from slipstream.processes import pid_alive, process_argv, signal_quietly
from slipstream.settings import SECRET_FIELDS

log = logging.getLogger(__name__)

LAUNCHER_MODULE = "trainers.launch"
LOOPBACK = "127.0.0.1"
JOB_DIR = "elastic"
JOB_FILE = "job.json"
RDZV_CONF: dict[str, str] = {"last_call_timeout": "3", "keep_alive_interval": "2", "keep_alive_max_attempt": "3"}
"""c10d rendezvous settings of an elastic job: a new round closes 3 s after its first node arrives
(torch's default waits 30 s), and a node that stopped sending its keep-alive every 2 s is dropped
after 3 missed ones (torch: 5 s x 3) — what a node leaving or dying costs before the rest go on."""
WORLDS_FILE = "worlds.jsonl"
"""In the run folder: one JSON line per event of the worlds the run trained on (the trainer writes it:
trainers.observe.world_log)."""
SHARED_STORE_OFF = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
"""Every launcher of an elastic job runs with the agents' shared store off: torch 2.14 never re-publishes
its address in a later rendezvous round, so a node joining a running job would wait for it until
its timeout. The workers' rank 0 then hosts their process group's store."""
ENV_KEPT = ("PYTHONPATH", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")
"""Besides SLIPSTREAM_* (secrets excepted): what a joining launcher takes from the first one."""


class ElasticError(SlipstreamError):
    """No such elastic job, or a launcher that cannot be added or removed."""


def node_addr(index: int) -> str:
    """Launcher N's rendezvous address: 127.0.0.(N+1), all on the loopback interface."""
    if not 0 <= index <= 253:
        raise ElasticError(f"launcher index {index} is out of range 0-253")
    return f"127.0.0.{index + 1}"


def rdzv_conf_arg(conf: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in conf.items())


def job_dir(run_path: Path) -> Path:
    return run_path / JOB_DIR


@dataclass(frozen=True)
class ElasticJob:
    """What every launcher of one job shares (`elastic/job.json`)."""

    endpoint: str
    """host:port of the c10d rendezvous (hosted by launcher 0)."""
    rdzv_id: str
    nnodes: str
    """MIN:MAX launchers."""
    nproc_per_node: int
    max_restarts: int
    shutdown_timeout_s: int
    rdzv_conf: dict[str, str]
    module: str
    trainer_args: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def torchrun_args(self, index: int) -> list[str]:
        """Launcher `index`'s torchrun arguments."""
        conf = self.rdzv_conf
        return ["--nnodes", self.nnodes, "--nproc-per-node", str(self.nproc_per_node), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", self.endpoint, "--rdzv-id", self.rdzv_id, "--local-addr", node_addr(index),
                "--rdzv-conf", rdzv_conf_arg(conf), "--max-restarts", str(self.max_restarts),
                "--shutdown-timeout", str(self.shutdown_timeout_s), "-m", self.module, *self.trainer_args]


def launcher_command(directory: Path, index: int, torchrun_args: list[str], *, standby: bool = False) -> list[str]:
    """`python -m trainers.launch --job-dir D --node-index N [--standby] -- <torchrun arguments>`."""
    return [sys.executable, "-m", LAUNCHER_MODULE, "--job-dir", str(directory), "--node-index", str(index),
            *(["--standby"] if standby else []), "--", *torchrun_args]


def local_launch_command(run_path: Path, torchrun_argv: list[str], *, standby: bool = False) -> list[str]:
    """The first launcher of an elastic job run on this machine, from its torchrun command
    (`TrainJobSpec.torchrun_args` with a rendezvous on 127.0.0.1): on launcher 0's address."""
    args = list(torchrun_argv[1:] if torchrun_argv and torchrun_argv[0] == "torchrun" else torchrun_argv)
    if "--local-addr" not in args:
        args[:0] = ["--local-addr", node_addr(0)]
    return launcher_command(job_dir(run_path), 0, args, standby=standby)


def shared_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of a launcher's environment every launcher of the job must share (no secret:
    a joining launcher reads those from the settings file or its own environment)."""
    secrets = {f"SLIPSTREAM_{name.upper()}" for name in SECRET_FIELDS}
    return {k: v for k, v in sorted(env.items())
            if (k.startswith("SLIPSTREAM_") and k not in secrets) or k in ENV_KEPT}


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a job's rendezvous)."""
    import socket

    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def read_worlds(run_path: Path) -> list[dict[str, Any]]:
    """The events of the run's `worlds.jsonl`, in order (a line cut short by a kill is skipped)."""
    try:
        lines = (run_path / WORLDS_FILE).read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# --- records --------------------------------------------------------------------------------
def _write_json(path: Path, value: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2))
    tmp.replace(path)


def write_job(directory: Path, job: ElasticJob) -> None:
    _write_json(directory / JOB_FILE, asdict(job))


def read_job(run_path: Path) -> ElasticJob:
    path = job_dir(run_path) / JOB_FILE
    try:
        return ElasticJob(**json.loads(path.read_text()))
    except FileNotFoundError:
        raise ElasticError(f"{path} does not exist: run {run_path.name} was not started as an elastic job here "
                           "(slipstream elastic start, or a DAG run with max_nodes > 1 on the local backend)") from None


@dataclass
class Launcher:
    """One launcher of the job (`elastic/launchers/N.json`)."""

    index: int
    pid: int = 0
    addr: str = ""
    log: str = ""
    started: float = 0.0
    ready: float = 0.0
    """When it had its workers' code loaded (0: not yet)."""
    standby: bool = False
    """Started to wait, loaded, for `activate` before it joins."""
    joined: float = 0.0
    """When it went to the rendezvous (0: not yet)."""
    ended: float = 0.0
    exit_code: int | None = None

    @property
    def alive(self) -> bool:
        """Running, and still a launcher (a reused pid is not)."""
        argv = process_argv(self.pid) if self.pid else None
        return bool(argv) and LAUNCHER_MODULE in argv and pid_alive(self.pid)  # type: ignore[operator]


def launcher_path(directory: Path, index: int) -> Path:
    return directory / "launchers" / f"{index}.json"


def write_launcher(directory: Path, launcher: Launcher) -> None:
    _write_json(launcher_path(directory, launcher.index), asdict(launcher))


def reserve_launcher(directory: Path, index: int) -> bool:
    """Claim launcher number `index` (False when another start claimed it first)."""
    path = launcher_path(directory, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(asdict(Launcher(index))))
    return True


def launchers(run_path: Path) -> list[Launcher]:
    """Every launcher the job has had, by index."""
    out = []
    for p in sorted((job_dir(run_path) / "launchers").glob("*.json"), key=lambda p: int(p.stem)):
        try:
            out.append(Launcher(**json.loads(p.read_text())))
        except (ValueError, TypeError):  # being written right now
            continue
    return out


# --- join, leave, stop ----------------------------------------------------------------------
def join(run_path: Path, env: Mapping[str, str] | None = None, *, standby: bool = False) -> Launcher:
    """Start one more launcher of the running job on this machine, in the background (its own
    session: it outlives this command); returns its record. It joins once its workers' code is
    loaded, or, as a `standby`, when `activate` tells it to."""
    job = read_job(run_path)
    directory = job_dir(run_path)
    if not any(launcher.alive for launcher in launchers(run_path) if launcher.index == 0):
        raise ElasticError(f"run {run_path.name}: its first launcher (which hosts the rendezvous) is not running; "
                           "start the job again with `slipstream elastic start`")
    index = 1 + max((launcher.index for launcher in launchers(run_path)), default=0)
    while not reserve_launcher(directory, index):
        index += 1
    log_path = directory / f"launcher-{index}.log"
    child_env = {**(os.environ if env is None else env), **job.env}
    with open(log_path, "ab") as fh:
        proc = subprocess.Popen(launcher_command(directory, index, job.torchrun_args(index), standby=standby),
                                env=child_env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    launcher = Launcher(index, pid=proc.pid, addr=node_addr(index), log=str(log_path), started=time.time(),
                        standby=standby)
    write_launcher(directory, launcher)
    log.info("run %s: launcher %d joins as %s (pid %d), log %s", run_path.name, index, launcher.addr, proc.pid, log_path)
    return launcher


def activate(run_path: Path, index: int | None = None) -> list[Launcher]:
    """Let standby launchers join (all of them, or launcher `index`): SIGUSR1, which a standby
    waits for once its workers' code is loaded (an earlier one is kept until then)."""
    waiting = [launcher for launcher in launchers(run_path)
               if launcher.standby and not launcher.joined and launcher.alive and index in (None, launcher.index)]
    if not waiting:
        raise ElasticError(f"run {run_path.name}: no standby launcher{f' {index}' if index is not None else ''} is waiting")
    for launcher in waiting:
        signal_quietly(launcher.pid, signal.SIGUSR1)
    return waiting


def leave(run_path: Path, index: int | None = None, wait_s: float = 0.0) -> Launcher:
    """SIGTERM a launcher that joined (the newest running one by default): its workers and every
    other rank stop at the next step boundary after one checkpoint, and the job goes on without
    it. Launcher 0 hosts the rendezvous and cannot leave (`stop` ends the whole job)."""
    running = [launcher for launcher in launchers(run_path) if launcher.alive]
    if index == 0:
        raise ElasticError(f"run {run_path.name}: launcher 0 hosts the job's rendezvous and stays while the job runs; "
                           "`slipstream elastic stop` stops the whole job (resumable)")
    joined = [launcher for launcher in running if launcher.index != 0 and (index is None or launcher.index == index)]
    if not joined:
        which = f"launcher {index}" if index is not None else "no launcher that joined"
        raise ElasticError(f"run {run_path.name}: {which} is running (see `slipstream elastic status {run_path.name}`)")
    launcher = joined[-1]
    signal_quietly(launcher.pid, signal.SIGTERM)
    log.info("run %s: launcher %d (pid %d) leaves", run_path.name, launcher.index, launcher.pid)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and launcher.alive:
        time.sleep(0.2)
    return launcher


def stop(run_path: Path) -> list[Launcher]:
    """SIGTERM every launcher: the job commits a checkpoint at the next step boundary and ends
    (resumable: start it again)."""
    running = [launcher for launcher in launchers(run_path) if launcher.alive]
    if not running:
        raise ElasticError(f"run {run_path.name}: no launcher is running")
    for launcher in running:
        signal_quietly(launcher.pid, signal.SIGTERM)
    return running


def check_bounds(nnodes: int, min_nodes: int, max_nodes: int) -> None:
    if not 1 <= min_nodes <= nnodes <= max_nodes:
        raise ConfigError(f"an elastic job needs 1 <= min_nodes <= nnodes <= max_nodes, got min_nodes={min_nodes}, "
                          f"nnodes={nnodes}, max_nodes={max_nodes}")
