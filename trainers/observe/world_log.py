"""`worlds.jsonl`: the worlds a run trained on, one JSON line per event (rank 0 writes).

An elastic run changes size while it runs: every membership change restarts the workers on a
new world, which resumes from the last checkpoint. Each start of a world writes
- `start`: its size, torchrun's restart count, when the workers' processes started and when they
  were ready (resumed), the step, phase and epoch they resumed at;
- `first_step`: when it took its first optimizer step (what a rescale costs ends here);
- `stop`: a graceful stop (trainers.parallel.graceful_stop): the step, the checkpoint that holds
  it and how many ranks were signalled. A world that was killed writes none: its successor's
  `start` step tells what the kill cost (the steps since that checkpoint).

Times are epoch seconds, comparable across processes on one machine.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psutil

from slipstream.pipeline.elastic import WORLDS_FILE, read_worlds

__all__ = ["WORLDS_FILE", "WorldLog", "read_worlds"]


class WorldLog:
    def __init__(self, run_dir: Path, enabled: bool, world: int) -> None:
        self.path = run_dir / WORLDS_FILE
        self.enabled, self.world = enabled, world
        self._stepped = False

    def _write(self, event: str, **values: Any) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"event": event, "time": time.time(), "world": self.world, **values}) + "\n")

    def started(self, step: int, phase: str, epoch: int, resumed: bool) -> None:
        self._write("start", restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                    process_started=psutil.Process().create_time(), step=step, phase=phase, epoch=epoch,
                    resumed=resumed)

    def stepped(self, step: int) -> None:
        """After every optimizer step: the first one of this world is written."""
        if not self._stepped:
            self._stepped = True
            self._write("first_step", step=step)

    def stopped(self, step: int, checkpoint: str, ranks: int) -> None:
        self._write("stop", step=step, checkpoint=checkpoint, ranks=ranks)
