"""The batch phase's choice of epoch: score each epoch on the validation days, keep the best weights.

After every epoch the model and its logistic baseline are scored on the validation days (rows
before T no model trains on, `trainers.eval.sets.validation_rows`); `EarlyStopping` records the
curve and says whether the epoch is the best so far, whose weights are then kept in
`checkpoint/best-<what>-epoch-<E>.pt` (a sharded model: every rank its own shards). When the
batch phase ends every rank continues with the best epoch's model and the baseline's own best.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import torch

from trainers.data.rows import Rows
from trainers.eval.baselines import Baselines
from trainers.eval.scoring import scores
from trainers.eval.validation import EarlyStopping, best_path, load_best, save_best
from trainers.parallel.dist import Dist

log = logging.getLogger(__name__)


class ModelHolder(Protocol):
    """What the choice needs of the trainer's model (`trainers.step.Stepper` has it)."""

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def sharded(self) -> bool: ...

    @property
    def baselines(self) -> Baselines: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def local_tensors(self) -> list[torch.Tensor]: ...


class BestEpoch:
    def __init__(self, early: EarlyStopping, d: Dist, checkpoint_dir: Path) -> None:
        self.early, self.d, self.dir = early, d, checkpoint_dir

    def _shards(self) -> str:
        return f"model-rank{self.d.rank}of{self.d.world}"

    def validate(self, epoch: int, holder: ModelHolder, rows: Rows) -> None:
        """Collective: score the model and the logistic baseline on the validation rows, keep the
        better weights (rank 0 writes them), decide whether to stop."""
        d, b = self.d, holder.baselines
        auc, loss, _, _ = scores(d.gather, holder.model, rows, d.device)
        b_auc, b_loss, _, _ = scores(d.gather, b.logistic, rows, d.device)
        improved, base_improved = self.early.record(epoch, loss, auc, b_loss, b_auc)
        if improved and holder.sharded:  # every rank keeps its own shards
            save_best(self.dir, epoch, self._shards(), {"tensors": holder.local_tensors()})
        if d.is_main:
            if improved and not holder.sharded:
                save_best(self.dir, epoch, "model", holder.state_dict())
            if base_improved:
                save_best(self.dir, epoch, "baseline", {"logistic": b.logistic.state_dict()})
        d.barrier()
        log.info("epoch %d: validation loss %.4f AUC %.4f (baseline %.4f / %.4f)%s", epoch, loss, auc, b_loss, b_auc,
                 " - best so far" if improved else f" - {self.early.since_best} without improvement")

    def restore(self, last: int, holder: ModelHolder) -> None:
        """Every rank: continue with the best epoch's model (and the baseline's own best)."""
        e = self.early
        if e.best_epoch >= 0 and e.best_epoch != last and holder.sharded:
            self._restore_shards(e.best_epoch, holder)
        elif e.best_epoch >= 0 and e.best_epoch != last:
            best = load_best(self.dir, e.best_epoch, "model")
            best.pop("known_users", None)  # the users every epoch trained, not rank 0's at that epoch
            holder.load_state_dict(best)
            log.info("the batch phase keeps epoch %d (validation loss %.4f), not the last one (%d)", e.best_epoch,
                     e.best_loss, last)
        if e.baseline_best_epoch >= 0 and e.baseline_best_epoch != last:
            holder.baselines.logistic.load_state_dict(load_best(self.dir, e.baseline_best_epoch, "baseline")["logistic"])

    def _restore_shards(self, epoch: int, holder: ModelHolder) -> None:
        """A sharded run: each rank puts back its shards of the best epoch (saved at this world size)."""
        found = float(best_path(self.dir, epoch, self._shards()).exists())
        if self.d.sum([found])[0] < self.d.world:  # resumed at another world size: the shards do not fit
            log.warning("the best epoch's shards (epoch %d) were saved at another world size: the batch phase keeps "
                        "its last epoch", epoch)
            return
        for dst, src in zip(holder.local_tensors(), load_best(self.dir, epoch, self._shards())["tensors"], strict=True):
            dst.copy_(src)
        log.info("the batch phase keeps epoch %d (validation loss %.4f)", epoch, self.early.best_loss)
