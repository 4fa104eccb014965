"""Keep one server of the local stack running: `python -m slipstream.dev.keepalive NAME -- ARGV...`.

Airflow's scheduler (and dag-processor, triggerer) exits when one loop of it fails, e.g. when
`airflow backfill create` deletes the runs of a backfill it could not finish (SQLite's `database is
locked`) while the scheduler holds them. On a cluster the pod is restarted; on the embedded stack
nothing did, and every later run waited forever. This wrapper restarts its program when it exits
on its own with a failure, at most `--max-restarts` times in `--window-s` seconds (then it gives
up with the program's status, so a program that cannot start is not restarted in a loop). A
SIGTERM or SIGINT to the wrapper (or to its process group: `slipstream.processes.stop_process`)
is passed on once to the program's own process group (Airflow takes a second SIGTERM as "do not
wait for running tasks"), and the wrapper exits once the program has (SIGKILL after `--grace-s`),
without restarting it. The program dies with the wrapper should the wrapper be killed.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from types import FrameType

from slipstream.processes import signal_quietly

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before its program runs: SIGKILL when the wrapper dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the wrapper's own stop still ends the program
        pass


class Keeper:
    """Runs `argv`, restarting it after a failed exit that nobody asked for."""

    def __init__(self, name: str, argv: Sequence[str], max_restarts: int, window_s: float, backoff_s: float,
                 grace_s: float) -> None:
        self.name, self.argv = name, list(argv)
        self.max_restarts, self.window_s, self.backoff_s, self.grace_s = max_restarts, window_s, backoff_s, grace_s
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def stop(self, signum: int, _frame: FrameType | None) -> None:
        if self.stopping:
            return
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            signal_quietly(self.child.pid, signum, group=True)

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        """The program's exit status; once a stop was asked for, SIGKILL after the grace period."""
        stop_seen: float | None = None
        while True:
            try:
                return child.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            if self.stopping:
                stop_seen = stop_seen or time.monotonic()
                if time.monotonic() - stop_seen > self.grace_s:
                    log.warning("%s did not stop within %.0f s: killing it", self.name, self.grace_s)
                    signal_quietly(child.pid, signal.SIGKILL, group=True)
                    return child.wait()

    def run(self) -> int:
        restarts: deque[float] = deque()
        while True:
            self.child = child = subprocess.Popen(self.argv, process_group=0, preexec_fn=_die_with_parent)
            rc = self._wait(child)
            if self.stopping or rc == 0:
                return rc
            now = time.monotonic()
            while restarts and now - restarts[0] > self.window_s:
                restarts.popleft()
            if len(restarts) >= self.max_restarts:
                log.error("%s exited with status %d, its %d restart(s) in the last %.0f s used up: giving up",
                          self.name, rc, len(restarts), self.window_s)
                return rc
            restarts.append(now)
            log.warning("%s exited with status %d; restarting it (%d of at most %d in %.0f s)",
                        self.name, rc, len(restarts), self.max_restarts, self.window_s)
            time.sleep(self.backoff_s)
            if self.stopping:
                return rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m slipstream.dev.keepalive", usage="%(prog)s NAME [options] -- PROGRAM [ARGS...]",
                                description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("name", help="the server's name, for the log")
    p.add_argument("--max-restarts", type=int, default=5)
    p.add_argument("--window-s", type=float, default=600.0)
    p.add_argument("--backoff-s", type=float, default=2.0)
    p.add_argument("--grace-s", type=float, default=12.0, help="after a stop, SIGKILL the program after this long")
    args = p.parse_args(own)
    if not command:
        p.error("give the program to keep running after --")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s keepalive: %(message)s")
    keeper = Keeper(args.name, command, args.max_restarts, args.window_s, args.backoff_s, args.grace_s)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, keeper.stop)
    return keeper.run()


if __name__ == "__main__":
    sys.exit(main())
