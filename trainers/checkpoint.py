"""Atomic checkpoints: model, optimizer and every rank's data progress, committed together.

Layout under `<run>/checkpoint/`:
    step-000000123/model.pt        rank 0: model, optimizer, grad scaler, step
    step-000000123/data-rank-R.pt  each rank: its data progress (cursor, shuffle/replay buffers, offsets)
    step-000000123/meta.json       rank 0: step, phase, world size, snapshot, offsets, global counters
    latest                         the name of the newest committed step folder
    batch_only/model.pt            the model as it was at the handoff (for the batch-only AUC)

A checkpoint is written into `step-N.tmp/` by all ranks, then rank 0 renames the folder and
replaces `latest` (both atomic renames): a kill at any moment leaves the previous checkpoint
intact and never a half-written one named by `latest`. Ranks must share the run folder (one
node, or a shared volume).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

log = logging.getLogger(__name__)

LATEST = "latest"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def step_name(step: int) -> str:
    return f"step-{step:09d}"


class Checkpointer:
    def __init__(self, root: Path, rank: int, barrier: Callable[[], None], keep: int = 2) -> None:
        self.root, self.rank, self.barrier, self.keep = root, rank, barrier, keep

    def latest(self) -> Path | None:
        pointer = self.root / LATEST
        if not pointer.exists():
            return None
        path = self.root / pointer.read_text().strip()
        if not (path / "meta.json").exists():
            raise FileNotFoundError(f"{pointer} names {path.name}, which is missing or incomplete: restore it or delete {pointer}")
        return path

    def save(self, step: int, model_state: dict[str, Any] | None, data_state: dict[str, Any],
             meta: dict[str, Any] | None) -> Path:
        """Collective: every rank calls it; model_state/meta are used on rank 0 only."""
        final = self.root / step_name(step)
        tmp = self.root / (step_name(step) + ".tmp")
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        self.barrier()
        atomic_torch_save(data_state, tmp / f"data-rank-{self.rank}.pt")
        if self.rank == 0:
            assert model_state is not None and meta is not None
            atomic_torch_save(model_state, tmp / "model.pt")
        self.barrier()
        if self.rank == 0:
            atomic_write_text(tmp / "meta.json", json.dumps(meta, indent=2, default=str))
            if final.exists():  # re-committing the same step (e.g. the end of an already-finished run)
                shutil.rmtree(final)
            os.replace(tmp, final)
            atomic_write_text(self.root / LATEST, final.name)
            _fsync_dir(self.root)
            self._prune(final)
            log.info("checkpoint %s committed", final)
        self.barrier()
        return final

    def _prune(self, newest: Path) -> None:
        steps = sorted(p for p in self.root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in steps[: max(0, len(steps) - self.keep)]:
            if old != newest:
                shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def load_meta(path: Path) -> dict[str, Any]:
        return json.loads((path / "meta.json").read_text())

    @staticmethod
    def load_model(path: Path) -> dict[str, Any]:
        return torch.load(path / "model.pt", map_location="cpu", weights_only=False)

    @staticmethod
    def load_data(path: Path, rank: int) -> dict[str, Any]:
        return torch.load(path / f"data-rank-{rank}.pt", map_location="cpu", weights_only=False)
