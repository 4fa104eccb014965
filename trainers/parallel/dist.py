"""Process group, device and the few collectives the trainer needs.

Launched by torchrun the job reads RANK/WORLD_SIZE/LOCAL_RANK from the environment and joins a
process group: NCCL when it trains on CUDA, gloo on CPU. When rank 0 hosts the group's store on a
loopback MASTER_ADDR (trainers.launch turns the agents' shared store off), it listens there only. Started as a plain `python -m
trainers.train` it is a world of one and every collective is the identity, so tests and
benchmarks run the same code without a launcher.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from slipstream.errors import ConfigError
from slipstream.processes import pid_alive, usable_cpus
from trainers.parallel.loopback import host_store, is_loopback

log = logging.getLogger(__name__)

LAUNCHER_PID_ENV = "SLIPSTREAM_LAUNCHER_PID"
"""Set by trainers.launch for its workers: the launcher whose death ends them."""


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def _collective_device(self) -> torch.device:
        # NCCL moves only CUDA tensors; gloo only CPU ones.
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks (float64 so sample counts stay exact)."""
        if not self.active:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().tolist()

    def max(self, values: list[float]) -> list[float]:
        if not self.active:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.cpu().tolist()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's object, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's object on every rank."""
        if not self.active:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self._collective_device())
        return box[0]

    def all_to_all_object(self, pieces: list[Any]) -> list[Any]:
        """All-to-all of picklable objects: `pieces[r]` goes to rank r; returns, in rank order, the
        piece every rank sent to this one (None travels as nothing and arrives as None).

        Two collectives whatever the payload: an all-gather of the world x world byte counts, then
        one `all_to_all_single` of the pickled bytes (skipped by every rank alike when all counts
        are zero). Each byte crosses the network once, unlike an all-gather of every piece."""
        if len(pieces) != self.world:
            raise ValueError(f"all_to_all_object needs {self.world} pieces, got {len(pieces)}")
        if not self.active:
            return list(pieces)
        blobs = [b"" if p is None else pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL) for p in pieces]
        dev = self._collective_device()
        sizes = torch.tensor([len(b) for b in blobs], dtype=torch.int64, device=dev)
        rows = [torch.empty_like(sizes) for _ in range(self.world)]
        dist.all_gather(rows, sizes)
        matrix = torch.stack(rows).cpu()  # matrix[src][dst]: bytes src sends dst
        if int(matrix.sum()) == 0:
            return [None] * self.world
        send_sizes = matrix[self.rank].tolist()
        recv_sizes = matrix[:, self.rank].tolist()
        payload = b"".join(blobs)
        inp = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
        out = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=dev)
        dist.all_to_all_single(out, inp.to(dev), output_split_sizes=recv_sizes, input_split_sizes=send_sizes)
        data = out.cpu().numpy().tobytes()
        got: list[Any] = []
        at = 0
        for n in recv_sizes:
            got.append(pickle.loads(data[at:at + n]) if n else None)
            at += n
        return got

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def select_device(choice: str, local_rank: int) -> torch.device:
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device is 'cuda' but no CUDA device is visible: use run.device=cpu or auto")
    if choice in ("cuda", "auto") and torch.cuda.is_available():
        n = torch.cuda.device_count()
        dev = torch.device("cuda", local_rank % n)
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def die_with_launcher() -> None:
    """Under torchrun, make the kernel SIGKILL this worker when the launcher dies.

    torchrun starts workers in their own sessions, so a `kill -9` of the launcher (an OOM kill,
    a preempted node agent) would otherwise leave workers training on, unsupervised, racing a
    restarted run for the same checkpoint folder. Linux only; elsewhere a no-op.

    A worker forked by trainers.launch's forkserver has that server as its parent, and the server
    lives on while any worker does (each holds its keep-alive pipe): there a thread watches the
    launcher itself (`SLIPSTREAM_LAUNCHER_PID`) and SIGKILLs the worker once it is gone."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    launcher = int(os.environ.get(LAUNCHER_PID_ENV, "0") or 0)
    if launcher and launcher != os.getppid():
        threading.Thread(target=_die_after, args=(launcher,), name="launcher-watch", daemon=True).start()
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except OSError as e:  # no libc.so.6 (musl ...): keep going without the guard
        log.warning("could not arm the parent-death signal: %s", e)
        return
    if os.getppid() == 1:  # the launcher died before the guard was armed
        os._exit(1)


def _die_after(pid: int, interval_s: float = 0.5) -> None:
    while pid_alive(pid):
        time.sleep(interval_s)
    log.error("the launcher (pid %d) is gone: this worker stops at once", pid)
    os.kill(os.getpid(), signal.SIGKILL)


def rank_cpus(cpus: list[int], local_rank: int, local_world: int) -> list[int]:
    """This local rank's even share of the node's `cpus` (one each, round robin, when there are
    fewer CPUs than ranks)."""
    if local_world <= 1:
        return list(cpus)
    share = len(cpus) // local_world
    if share == 0:
        return [cpus[local_rank % len(cpus)]]
    return cpus[local_rank * share:(local_rank + 1) * share]


def bind_rank_cpus() -> list[int] | None:
    """`run.cpu_affinity=per_rank`: confine every thread of this process (those started by the
    imports too) to this local rank's share of the CPUs; threads started later inherit it.
    Returns the CPUs, or None where affinity cannot be set (not Linux)."""
    if not hasattr(os, "sched_setaffinity"):
        log.warning("run.cpu_affinity=per_rank: CPU affinity cannot be set on this platform; ignored")
        return None
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    mine = rank_cpus(usable_cpus(), local_rank, local_world)
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), mine)
        except (ProcessLookupError, PermissionError):  # a thread that just ended
            continue
    log.info("local rank %d of %d: CPU(s) %s", local_rank, local_world, mine)
    return mine


def loopback_group_store(rank: int, world: int, timeout: timedelta) -> dist.Store | None:
    """The process group's store when rank 0 hosts it (torchrun without the agents' shared store) on
    a loopback MASTER_ADDR: listening on that address only. None: torch's own env:// rendezvous."""
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "False" or not port or not is_loopback(addr):
        return None
    if rank == 0:
        return host_store(addr, int(port), world, timeout)
    return dist.TCPStore(addr, int(port), world, False, timeout)


def init_distributed(device_choice: str, timeout_s: float = 600.0, cpu_affinity: str = "none") -> Dist:
    die_with_launcher()
    if cpu_affinity == "per_rank":
        bind_rank_cpus()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = select_device(device_choice, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if world > 1 and not dist.is_initialized():
        kwargs: dict[str, Any] = {"backend": backend, "timeout": timedelta(seconds=timeout_s)}
        if backend == "nccl":
            kwargs["device_id"] = device
        store = loopback_group_store(rank, world, timedelta(seconds=timeout_s))
        if store is not None:
            kwargs.update(store=store, rank=rank, world_size=world)
        dist.init_process_group(**kwargs)
        log.info("rank %d/%d joined the %s process group on %s", rank, world, backend, device)
    return Dist(rank=rank, world=world, local_rank=local_rank, device=device, backend=backend)
