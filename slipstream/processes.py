"""Process supervision on psutil: start a server in its own process group, tell whether it still
runs (zombies do not count), stop the whole group, list a process's descendants.

Every server and job Slipstream starts (the local stack's broker and S3 server, Airflow's
components, a local torchrun) is stopped through here, by the PID recorded when it started.
A command that starts servers stops them in `finally` (or `except BaseException`) blocks; SIGTERM
is turned into an exception (`exit_on_sigterm`) so those blocks run on `kill` as on Ctrl-C.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import psutil

log = logging.getLogger(__name__)


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not reaped, does not)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)  # psutil is untyped: its values are Any
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it exists
        return True


def process_argv(pid: int) -> list[str] | None:
    """The command line of `pid`, or None when it is gone or not ours to read."""
    try:
        argv: list[str] = psutil.Process(pid).cmdline()
        return argv
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def group_alive(pgid: int) -> bool:
    """Whether any live process belongs to process group `pgid`.

    A server's leader can exit before its children do (a launcher that waits on the real binary
    dies on SIGTERM at once while the binary still closes its listener), so stopping waits for
    the whole group, not only for the PID that was recorded."""
    for proc in psutil.process_iter(["status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if os.getpgid(proc.pid) == pgid:
                return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, children before grandchildren."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def start_process(name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
                  cpus: Collection[int] | None = None) -> int:
    """Start a server in its own process group (so `stop_process` ends its children too), its
    output appended to `log_path`; returns its PID. `cpus`: confine it, and every process it
    starts, to these CPUs (set before its program runs, so every thread it makes inherits it)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as fh:
        proc = subprocess.Popen(
            list(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, **(env or {})}, preexec_fn=confine_to(cpus),
        )
    log.info("started %s (pid %d)%s, log %s", name, proc.pid,
             f" on CPU(s) {sorted(cpus)}" if cpus is not None else "", log_path)
    return proc.pid


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


def confine_to(cpus: Collection[int] | None) -> Callable[[], None] | None:
    """A `preexec_fn` that confines a child to `cpus` before its program runs (so every thread
    and process it starts inherits them); None when `cpus` is None."""
    if cpus is None:
        return None
    chosen = set(cpus)
    return lambda: os.sched_setaffinity(0, chosen)


def signal_quietly(pid: int, sig: int, *, group: bool = False) -> None:
    """Send `sig` to a process (or its group); one that is already gone is no error."""
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except ProcessLookupError:
        pass


def stop_process(pid: int, timeout_s: float = 15.0) -> None:
    """Stop the process group a server was started in (SIGTERM, then SIGKILL after `timeout_s`)
    and return once every process of it has exited, so its ports are free."""
    def gone() -> bool:
        return not pid_alive(pid) and not group_alive(pid)

    if gone():
        return
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if gone():
                return
            time.sleep(0.1)
    log.warning("process group %d still has live processes after SIGKILL", pid)


class Terminated(SystemExit):
    """SIGTERM, raised in the main thread so that `finally` blocks stop what the command started."""


def exit_on_sigterm() -> None:
    """Make SIGTERM raise `Terminated` (exit status 143) in the main thread instead of ending the
    process on the spot (Python's default), which left the servers a command had started running.
    SIGINT already raises KeyboardInterrupt. A second SIGTERM during the cleanup is ignored."""

    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log.warning("SIGTERM: stopping what this command started")
        raise Terminated(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)


@contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Hold SIGTERM until the block has ended: for a start that cannot be undone half-way (a JVM
    whose PID its launcher only returns once it is up). The signal is re-sent at the end."""
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if got:
            os.kill(os.getpid(), signal.SIGTERM)
