"""How far the stream has drifted from the window: fresh-sample loss against replayed-sample loss.

Each stream batch mixes fresh Kafka rows with rows replayed from the window's last hours, and one
forward pass scores both. On stationary data the two losses are alike (the fresh rows are only
unseen: a few % higher); when the click model changes, the fresh rows' loss jumps while the
replayed rows still fit (measured: +~40 % vs +~5 %, docs/trainer.md, Model quality). `DriftGauge`
keeps exponential averages of both over the last `window_rows` fresh rows and maps the relative
excess of fresh over replay to a level in [0, 1], which `trainers.model.phase_lrs` uses to set the
stream phase's shared learning rate between the batch phase's rate per sample (level 0: no drift,
the stream only adds samples) and `optim.stream_lr` (level 1: follow the change).

The gauge is fed all-reduced sums, so every rank holds the same state and sets the same rates; the
state (`state_dict`) is a few floats in the checkpoint's meta, so a resumed run steps exactly as an
uninterrupted one. No torch here: it is arithmetic on floats.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from slipstream.errors import ResumeError
from trainers.stateful import check_version

STATE_VERSION = 1


@dataclass
class DriftGauge:
    window_rows: float
    """Fresh rows over which the losses are averaged (the averages' e-folding length)."""
    low: float
    """Relative excess of fresh over replay loss at and below which the level is 0."""
    high: float
    """Relative excess at and above which the level is 1."""
    fresh: float = 0.0
    replay: float = 0.0
    weight: float = 0.0
    """Sum of the averaging weights so far (0: no observation yet)."""

    def update(self, fresh_loss_sum: float, fresh_rows: float, replay_loss_sum: float, replay_rows: float) -> None:
        """Add one step's loss sums (all ranks together); a step without both kinds of rows tells nothing."""
        if fresh_rows <= 0 or replay_rows <= 0:
            return
        keep = math.exp(-fresh_rows / self.window_rows)
        self.fresh = keep * self.fresh + (1 - keep) * fresh_loss_sum / fresh_rows
        self.replay = keep * self.replay + (1 - keep) * replay_loss_sum / replay_rows
        self.weight = keep * self.weight + (1 - keep)

    @property
    def excess(self) -> float:
        """Relative excess of the fresh rows' mean loss over the replayed rows' (0 before any step).
        Both averages share the same start-up weight, so it cancels in the ratio."""
        if self.weight <= 0 or self.replay <= 0:
            return 0.0
        return (self.fresh - self.replay) / self.replay

    @property
    def level(self) -> float:
        """0 (no drift seen) ... 1 (drift): where the shared stream rate sits between its bounds."""
        return min(1.0, max(0.0, (self.excess - self.low) / (self.high - self.low)))

    def state_dict(self) -> dict[str, float]:
        return {"version": STATE_VERSION, **{k: float(v) for k, v in asdict(self).items()}}

    def load_state_dict(self, state: dict[str, float] | None) -> None:
        """Restore the averages of a checkpoint (the bounds stay the config's); None: no gauge yet."""
        if not state:
            return
        check_version("drift gauge", state, STATE_VERSION)
        try:
            fresh, replay, weight = float(state["fresh"]), float(state["replay"]), float(state["weight"])
        except (KeyError, TypeError, ValueError):
            raise ResumeError(f"the checkpoint's drift gauge state {state!r} lacks fresh/replay/weight: it is damaged") from None
        if not (math.isfinite(fresh) and math.isfinite(replay) and 0.0 <= weight <= 1.0):
            raise ResumeError(f"the checkpoint's drift gauge state {state!r} is out of range: it is damaged")
        self.fresh, self.replay, self.weight = fresh, replay, weight
