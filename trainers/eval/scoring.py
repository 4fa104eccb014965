"""Scoring rows with a model: probabilities in batches, gathered over ranks.

Every evaluation of the trainer goes through here: the validation days after each epoch, the
prequential scores of the stream (`trainers.eval.prequential`) and the end-of-run sets
(`trainers.eval.evaluate`). The statistics (AUC, logloss and their intervals over users) are
`slipstream.scoring`'s, shared with the registry and the benches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from slipstream.samples.schema import id_hash
from slipstream.samples.spec import Spec
from slipstream.scoring import auc, logloss
from trainers.data.rows import Features, Rows

log = logging.getLogger(__name__)

SCORE_BATCH = 8192
Gather = Callable[[Any], list[Any]]


@torch.no_grad()
def score(model: nn.Module, rows: Rows, device: torch.device, batch: int = SCORE_BATCH, passes: int = 0) -> np.ndarray:
    """The model's probabilities for `rows` (eval mode: no dropout), in batches; at least `passes`
    forward passes (empty ones after the rows): a sharded model's forward is collective, so every
    rank runs as many."""
    was_training = model.training
    model.eval()
    out = []
    try:
        for s in range(0, len(rows), batch):
            feats = Features.from_rows(rows.slice(s, s + batch)).to(device)
            out.append(torch.sigmoid(model(feats).float()).cpu().numpy())
        for _ in range(passes - len(out)):
            model(Features.from_rows(rows.slice(0, 0)).to(device))
    finally:
        model.train(was_training)
    return np.concatenate(out).astype(np.float64) if out else np.zeros(0, dtype=np.float64)


def passes_for(gather: Gather, n_rows: int, batch: int = SCORE_BATCH) -> int:
    """Collective: the forward passes every rank runs to score its `n_rows` (the most any rank needs)."""
    return int(max(gather(-(-n_rows // batch))))


def score_everywhere(gather: Gather, model: nn.Module, rows: Rows, device: torch.device) -> np.ndarray:
    """Collective: this rank's probabilities for its `rows`, every rank running as many passes."""
    return score(model, rows, device, passes=passes_for(gather, len(rows)))


def gathered(gather: Gather, *columns: np.ndarray) -> list[np.ndarray]:
    """Collective: each column concatenated over ranks (rank order)."""
    everything = gather(tuple(columns))
    return [np.concatenate([e[i] for e in everything]) if everything else np.zeros(0) for i in range(len(columns))]


def scores(gather: Gather, model: nn.Module, rows: Rows, device: torch.device) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Collective: (AUC, logloss, labels, probabilities) of `model` on every rank's `rows`."""
    probs = score_everywhere(gather, model, rows, device)
    labels, p = gathered(gather, rows.label.astype(np.float64), probs)
    return auc(labels, p), logloss(labels, p), labels, p


def user_groups(rows: Rows, spec: Spec) -> np.ndarray:
    """Each row's user (the id feature with role user): the bootstrap's groups; without a user
    feature each row is its own group, named by its sample id's hash (unique across steps and
    ranks, whose rows are gathered and judged together)."""
    user = spec.with_role("user")
    if user is None:
        return id_hash(rows.sample_id).view(np.int64)
    return rows.sparse[:, [f.name for f in spec.sparse].index(user.name)].astype(np.int64)
