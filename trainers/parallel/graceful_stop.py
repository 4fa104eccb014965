"""A graceful stop: on SIGTERM or SIGINT every rank stops at the next step boundary, after one
checkpoint that holds every step taken.

torchrun's elastic agent restarts all of a job's workers whenever its membership changes: when a
node joins, every agent sends its workers SIGTERM and waits `--shutdown-timeout` seconds before
SIGKILL; when a node leaves, its launcher got SIGTERM and passes it on to its own workers. A
person, Airflow or Kubernetes stops a job the same way. Python's default action ends a worker on
the spot, and the run would lose every step since its last checkpoint.

Here the signal only sets a flag. Each rank adds it to the small all-reduce that every step already
makes of its control values (row counts, rank 0's wish to checkpoint), so all ranks see the same
sum after the same step, wherever the signal landed: all of them commit one checkpoint together
and leave with `EXIT_STOPPED`. A rank that was not signalled exits so too: its agent counts the
exit as a failure and restarts it on the next rendezvous round, which is how the remaining nodes
of a shrinking job move to the smaller world (torch counts that restart against
`--max-restarts`; a node joining does not). A second signal takes the default action at once.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

EXIT_STOPPED = 3
"""A worker's exit status after a graceful stop: its progress is committed; run it again (torchrun's
agent does, within its restart budget) to resume."""
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """This process's stop flag: set by the first SIGTERM/SIGINT once `install` ran."""

    def __init__(self) -> None:
        self.signal = ""
        """Name of the first signal received ('' while none)."""
        self.at = 0.0
        """When it arrived (epoch seconds)."""

    @property
    def requested(self) -> bool:
        return bool(self.signal)

    def wish(self) -> float:
        """This rank's vote for the step's all-reduce: 1 once a signal arrived."""
        return 1.0 if self.signal else 0.0

    def install(self) -> None:
        """Handle SIGTERM and SIGINT in this process (main thread only, as Python requires)."""
        for sig in SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signal:  # a second signal: the default action, now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signal, self.at = signal.Signals(signum).name, time.time()
        log.warning("%s: stopping at the next step boundary after a checkpoint (a second signal stops at once)",
                    self.signal)


REQUEST = StopRequest()
"""The process's stop request (`install` it once, in the entry point)."""


@dataclass
class GracefulStop(Exception):
    """Raised on every rank once the checkpoint of a graceful stop is committed."""

    step: int
    checkpoint: str
    ranks: int
    """How many ranks had been signalled."""

    def __str__(self) -> str:
        return (f"stopped at step {self.step} on a signal to {self.ranks} rank(s), after committing "
                f"{self.checkpoint or 'nothing new'}")
