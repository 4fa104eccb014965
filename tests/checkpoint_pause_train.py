"""`torchrun -m tests.checkpoint_pause_train ...`: the trainer, paused at one moment of a checkpoint
re-save so a test can kill -9 it exactly there.

PAUSE_AT names a method of `trainers.checkpoint.store.Checkpointer` (`_publish`, `_point_latest`,
`_prune`); when rank 0 calls it while committing a step that is already committed (the handoff
re-commits the batch phase's last step), it writes `<checkpoint>/paused` and sleeps until killed.
Nothing in the trainer's own code knows about this.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from trainers.checkpoint import store as checkpoint
from trainers.train import exit_worker, main


def _pausing(name: str) -> None:
    real = getattr(checkpoint.Checkpointer, name)

    def paused(self: checkpoint.Checkpointer, *args: Any) -> Any:
        step = (checkpoint.folder_order(self._committed) or (-1, 0))[0] if self._committed else -1
        new = checkpoint.folder_order(Path(str(args[-1])).name)
        if self.rank == 0 and new is not None and new[0] == step:
            (self.root / "paused").write_text(f"{name} {args}")
            while True:
                time.sleep(1)
        return real(self, *args)

    setattr(checkpoint.Checkpointer, name, paused)


if __name__ == "__main__":
    _pausing(os.environ["PAUSE_AT"])
    exit_worker(main())
