"""How much a fresher model is worth: the same stream rows scored by models refreshed at different
cadences (`bench freshness`).

The trainer's own stream step (`trainers.step.Stepper.test_then_train`: replay, drift gauge, the
stream phase's rates) runs over the stream in event-time order from the batch model. A model
refreshed every `c` seconds serves a row at time t with the model trained on the rows before the
last boundary floor(t / c) * c: at each step, rows whose period begins after the served snapshot's
are served by the model as it is before the step (trained on rows before the step's first row, so
never on a row at or after the boundary: a snapshot is, if anything, staler than exact), the
others by the snapshot still served. A daily model serves every row of a stream shorter than a
day with the batch model. Every cadence scores exactly the same rows; the differences are paired
(bootstrap over users).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import numpy as np
import torch

from trainers.data.rows import Rows
from trainers.eval.online import StreamEvaluator
from trainers.eval.scoring import score, user_groups
from trainers.step import Stepper

log = logging.getLogger(__name__)


@dataclass
class Served:
    """The model a cadence serves and the period (event-time seconds // cadence) it was refreshed in."""

    cadence_s: int
    model: torch.nn.Module
    period: int


def simulate(stepper: Stepper, online: StreamEvaluator, stream: Rows, replay: Rows, reference: Rows,
             cadences_s: dict[str, int], t_us: int, step_rows: int, replay_rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Train over `stream` (event-time order) and score every row with each cadence's served model;
    returns each cadence's probabilities (by name), the labels (`label`) and the users (`user`)."""
    device = stepper.d.device
    served = {name: Served(c, _frozen(stepper.model), (t_us // 1_000_000) // c) for name, c in cadences_s.items()}
    probs = {name: np.zeros(len(stream)) for name in cadences_s}
    rng = np.random.default_rng([seed, 83])
    order = np.argsort(stream.event_us, kind="stable")
    stream = stream.take(order)
    for start in range(0, len(stream), step_rows):
        batch = stream.slice(start, start + step_rows)
        periods_s = batch.event_us // 1_000_000
        live = None
        for name, s in served.items():
            newer = periods_s // s.cadence_s > s.period
            if newer.any():
                live = live if live is not None else _frozen(stepper.model)
                probs[name][start:start + len(batch)][newer] = score(live, batch.mask(newer), device)
            if (~newer).any():
                probs[name][start:start + len(batch)][~newer] = score(s.model, batch.mask(~newer), device)
            if newer.any():
                s.model, s.period = live, int(periods_s.max() // s.cadence_s)  # type: ignore[assignment]
        rep = replay.take(rng.integers(0, len(replay), replay_rows)) if len(replay) and replay_rows else replay.slice(0, 0)
        ref = reference.take(rng.integers(0, len(reference), replay_rows)) if len(reference) else None
        stepper.test_then_train(batch, rep, ref, online, passes=1)
    return {**probs, "label": stream.label.astype(np.float64), "user": user_groups(stream, stepper.spec)}


def _frozen(model: torch.nn.Module) -> torch.nn.Module:
    m = copy.deepcopy(model)
    m.eval()
    return m
