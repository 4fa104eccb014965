"""Time-based validation and early stopping of the batch phase.

The last `data.validation_days` of the window (before T) are the validation set: they are never
trained in the batch phase (never a random split: a random holdout of the same days measures
interpolation, which is easy; the days just before T measure what comes next). After every epoch
the model and the logistic baseline are scored on them (`trainers.eval.sets.validation_rows`); the
epoch with the lowest validation loss is kept (its weights in `checkpoint/best-epoch-<E>.pt`), and
the batch phase stops once `data.patience` epochs in a row brought no improvement, so
`data.epochs` is a cap. The kept model goes on to the stream phase. The validation rows are
never trained, replayed or used for scaling; in the stream phase the drift gauge compares fresh
rows with them (both unseen, so memorisation is not read as drift).

The curve, the best epoch and the patience counter are the piece's state (`state_dict`), saved with
every checkpoint, so a resumed run keeps the same choice.
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any

import torch

from trainers.checkpoint.stateful import check_version
from trainers.checkpoint.store import atomic_torch_save

log = logging.getLogger(__name__)

STATE_VERSION = 1


class EarlyStopping:
    """The validation curve and the choice of the best epoch (see the module docstring)."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.curve: list[dict[str, float]] = []
        """Per finished epoch: epoch, loss and AUC of the model and of the logistic baseline."""
        self.best_epoch = -1
        self.best_loss = math.inf
        self.baseline_best_epoch = -1
        self.baseline_best_loss = math.inf
        self.since_best = 0
        self.stopped = False

    def record(self, epoch: int, loss: float, auc: float, baseline_loss: float, baseline_auc: float) -> tuple[bool, bool]:
        """Add an epoch's scores; returns (the model improved, the baseline improved). A NaN loss
        (no validation rows) counts as an improvement: without data every epoch is kept."""
        self.curve.append({"epoch": epoch, "loss": loss, "auc": auc, "baseline_loss": baseline_loss,
                           "baseline_auc": baseline_auc})
        improved = math.isnan(loss) or loss < self.best_loss
        if improved:
            self.best_epoch, self.best_loss, self.since_best = epoch, (loss if not math.isnan(loss) else self.best_loss), 0
        else:
            self.since_best += 1
            self.stopped = self.since_best >= self.patience
        base_improved = math.isnan(baseline_loss) or baseline_loss < self.baseline_best_loss
        if base_improved:
            self.baseline_best_epoch = epoch
            if not math.isnan(baseline_loss):
                self.baseline_best_loss = baseline_loss
        return improved, base_improved

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "curve": list(self.curve), "best_epoch": self.best_epoch,
                "best_loss": _finite(self.best_loss), "baseline_best_epoch": self.baseline_best_epoch,
                "baseline_best_loss": _finite(self.baseline_best_loss), "since_best": self.since_best,
                "stopped": self.stopped}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:  # a checkpoint from before validation existed: start the curve afresh
            return
        check_version("early stopping", state, STATE_VERSION)
        self.curve = [dict(c) for c in state["curve"]]
        self.best_epoch, self.best_loss = int(state["best_epoch"]), _loss(state["best_loss"])
        self.baseline_best_epoch = int(state["baseline_best_epoch"])
        self.baseline_best_loss = _loss(state["baseline_best_loss"])
        self.since_best, self.stopped = int(state["since_best"]), bool(state["stopped"])


def _finite(x: float) -> float | None:
    """A loss as plain JSON (meta.json has no inf/NaN): None when not finite."""
    return x if math.isfinite(x) else None


def _loss(x: float | None) -> float:
    """A stored loss back: None (not finite when saved) as inf."""
    return math.inf if x is None else float(x)


def best_path(checkpoint_dir: Path, epoch: int, what: str = "model") -> Path:
    return checkpoint_dir / f"best-{what}-epoch-{epoch}.pt"


def save_best(checkpoint_dir: Path, epoch: int, what: str, state: dict[str, Any]) -> None:
    """Rank 0: keep an epoch's weights as the best so far (older bests of `what` removed)."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(state, best_path(checkpoint_dir, epoch, what))
    for old in checkpoint_dir.glob(f"best-{what}-epoch-*.pt"):
        if old.name != best_path(checkpoint_dir, epoch, what).name:
            with contextlib.suppress(FileNotFoundError):
                old.unlink()


def load_best(checkpoint_dir: Path, epoch: int, what: str) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(best_path(checkpoint_dir, epoch, what), map_location="cpu", weights_only=True)
    return state
