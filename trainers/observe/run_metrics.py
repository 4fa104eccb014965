"""Run metrics: one JSON line per logging step, TensorBoard scalars, and the final summary.

Only rank 0 writes; values it logs are already reduced over ranks by the caller.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from trainers.checkpoint.store import atomic_write_text

log = logging.getLogger(__name__)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (np.floating, np.integer)):
        return _clean(v.item())
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    return v


class MetricsLogger:
    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool) -> None:
        self.enabled = enabled
        self.run_dir = run_dir
        self._tb = None
        if enabled:
            run_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(run_dir / "metrics.jsonl", "a")
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(run_dir / "tb"))

    def log(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = _clean({"step": step, **values})
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, step)

    def summary(self, values: dict[str, Any]) -> Path:
        path = self.run_dir / "metrics.json"
        if self.enabled:
            atomic_write_text(path, json.dumps(_clean(values), indent=2, default=str))
            if self._tb is not None:
                for k, v in values.items():
                    if isinstance(v, float) and math.isfinite(v):
                        self._tb.add_scalar(f"final/{k}", v, int(values.get("step", 0)))
        return path

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            if self._tb is not None:
                self._tb.close()


class ProgressLog:
    """A metrics.jsonl line (and TensorBoard scalars) every `every` steps: the mean loss, samples/s
    and the share of time spent waiting for data since the previous line."""

    def __init__(self, logger: MetricsLogger, every: int) -> None:
        self.logger, self.every = logger, every
        self._last = (time.monotonic(), 0, 0.0, 0.0)  # when, trained_global, train_s, wait_s
        self.logged_step = -1
        """The step of the last line written."""

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def log(self, step: int, loss: float, trained_global: int, train_s: float, wait_s: float,
            values: dict[str, Any]) -> None:
        now = time.monotonic()
        t_prev, n_prev, train_prev, wait_prev = self._last
        self.logger.log(step, {
            "phase": values.pop("phase"), "epoch": values.pop("epoch"), "loss": loss,
            "samples_per_s": (trained_global - n_prev) / max(now - t_prev, 1e-9),
            "data_wait_share": (wait_s - wait_prev) / max(train_s - train_prev, 1e-9),
            **values,
        })
        self._last = (now, trained_global, train_s, wait_s)
        self.logged_step = step


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None
