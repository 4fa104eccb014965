"""How far the stream has drifted from the window: fresh-sample loss against replayed-sample loss.

Each stream batch mixes fresh Kafka rows with rows replayed from the window's last hours, and one
forward pass scores both. On stationary data the two losses are alike (the fresh rows are only
unseen: a few % higher); when the click model changes, the fresh rows' loss jumps while the
replayed rows still fit (measured: +~40 % vs +~5 %, docs/trainer.md, Model quality). `DriftGauge`
keeps exponential averages of both over the last `window_rows` fresh rows and maps the relative
excess of fresh over replay to a level in [0, 1], which `trainers.optim.groups.phase_lrs` uses to set the
stream phase's shared learning rate between the batch phase's rate per sample (level 0: no drift,
the stream only adds samples) and `optim.stream_lr` (level 1: follow the change).

Rows are compared with rows of the same kind. Fresh rows of users the model never trained on lose
more than rows of known users whatever the click model does (cold start), so the gauge keeps its
averages per kind (`trainers.optim.known_users`: known users, new users) and weighs each kind's excess by its
share of the fresh rows: a stream with more new users than the replayed rows is not read as drift.
With validation days (the default) the replayed rows are theirs, rows the model never trained on,
so memorisation over many epochs is not read as drift either.

The gauge is fed all-reduced sums, so every rank holds the same state and sets the same rates; the
state (`state_dict`) is a few floats in the checkpoint's meta, so a resumed run steps exactly as an
uninterrupted one. No torch here: it is arithmetic on floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from slipstream.errors import ResumeError
from trainers.checkpoint.stateful import check_version

STATE_VERSION = 2
KINDS = 2
"""Kinds of rows compared separately (`trainers.optim.known_users`: rows of users the batch phase trained,
rows of new users)."""


@dataclass
class DriftGauge:
    window_rows: float
    """Fresh rows (of one kind) over which its losses are averaged (the averages' e-folding length)."""
    low: float
    """Relative excess of fresh over replay loss at and below which the level is 0."""
    high: float
    """Relative excess at and above which the level is 1."""
    fresh: list[float] = field(default_factory=lambda: [0.0] * KINDS)
    replay: list[float] = field(default_factory=lambda: [0.0] * KINDS)
    weight: list[float] = field(default_factory=lambda: [0.0] * KINDS)
    """Per kind: the averages and the sum of their weights so far (0: no observation yet)."""
    rows: list[float] = field(default_factory=lambda: [0.0] * KINDS)
    """Per kind: fresh rows seen, decayed like the averages (each kind's share of the stream)."""

    def update(self, fresh_loss_sum: float, fresh_rows: float, replay_loss_sum: float, replay_rows: float) -> None:
        """One step's loss sums (all ranks together) with one kind of row."""
        self.update_kinds([(fresh_loss_sum, fresh_rows, replay_loss_sum, replay_rows)])

    def update_kinds(self, sums: list[tuple[float, float, float, float]]) -> None:
        """One step's (fresh loss sum, fresh rows, replay loss sum, replay rows) per kind, all ranks
        together. A kind without both fresh and replayed rows in the step tells nothing this step."""
        for k, (f_sum, f_rows, r_sum, r_rows) in enumerate(sums):
            if f_rows <= 0 or r_rows <= 0:
                continue
            keep = math.exp(-f_rows / self.window_rows)
            self.fresh[k] = keep * self.fresh[k] + (1 - keep) * f_sum / f_rows
            self.replay[k] = keep * self.replay[k] + (1 - keep) * r_sum / r_rows
            self.weight[k] = keep * self.weight[k] + (1 - keep)
            self.rows[k] = keep * self.rows[k] + f_rows

    @property
    def excess(self) -> float:
        """Relative excess of the fresh rows' mean loss over the replayed rows', within each kind,
        averaged with the kinds' shares of the fresh rows (0 before any step). Each kind's two
        averages share the same start-up weight, so it cancels in its ratio."""
        seen = [k for k in range(KINDS) if self.weight[k] > 0 and self.replay[k] > 0]
        total = sum(self.rows[k] for k in seen)
        if total <= 0:
            return 0.0
        return sum(self.rows[k] / total * (self.fresh[k] - self.replay[k]) / self.replay[k] for k in seen)

    @property
    def new_share(self) -> float:
        """Share of the recent fresh rows that are of the second kind (new users)."""
        total = sum(self.rows)
        return self.rows[1] / total if total > 0 else 0.0

    @property
    def level(self) -> float:
        """0 (no drift seen) ... 1 (drift): where the shared stream rate sits between its bounds."""
        return min(1.0, max(0.0, (self.excess - self.low) / (self.high - self.low)))

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "window_rows": float(self.window_rows), "low": float(self.low),
                "high": float(self.high), **{k: [float(x) for x in getattr(self, k)] for k in ("fresh", "replay", "weight", "rows")}}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore the averages of a checkpoint (the bounds stay the config's); None: no gauge yet.
        A version-1 state (one kind of row) becomes the first kind's."""
        if not state:
            return
        if state.get("version", 1) == 1 and isinstance(state, dict):
            state = _from_v1(state)
        check_version("drift gauge", state, STATE_VERSION)
        try:
            values = {k: [float(x) for x in state[k]] for k in ("fresh", "replay", "weight", "rows")}
        except (KeyError, TypeError, ValueError):
            raise ResumeError(f"the checkpoint's drift gauge state {state!r} lacks fresh/replay/weight/rows: it is damaged") from None
        ok = all(len(v) == KINDS and all(math.isfinite(x) for x in v) for v in values.values())
        if not (ok and all(0.0 <= w <= 1.0 for w in values["weight"])):
            raise ResumeError(f"the checkpoint's drift gauge state {state!r} is out of range: it is damaged")
        for k, v in values.items():
            setattr(self, k, v)


def _from_v1(state: dict[str, Any]) -> dict[str, Any]:
    try:
        fresh, replay, weight = float(state["fresh"]), float(state["replay"]), float(state["weight"])
    except (KeyError, TypeError, ValueError):
        raise ResumeError(f"the checkpoint's drift gauge state {state!r} lacks fresh/replay/weight: it is damaged") from None
    pad = [0.0] * (KINDS - 1)
    return {"version": STATE_VERSION, "fresh": [fresh, *pad], "replay": [replay, *pad], "weight": [weight, *pad],
            "rows": [1.0, *pad]}
