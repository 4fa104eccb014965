"""Held-out evaluation: AUC and logloss of a model on rows, gathered over ranks.

Held-out rows (`slipstream.samples.schema.is_holdout`) never train. Before T they come from the batch
window at the pinned snapshot; after T from the Kafka records the stream phase read (re-read by
offset range, so the evaluation set does not depend on when a run was killed and resumed).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
from torch import nn

from slipstream.scoring import auc as roc_auc
from trainers.data.rows import Features, Rows

log = logging.getLogger(__name__)


SCORE_BATCH = 8192


@torch.no_grad()
def score(model: nn.Module, rows: Rows, device: torch.device, batch: int = SCORE_BATCH, passes: int = 0) -> np.ndarray:
    """The model's probabilities for `rows`, in batches; at least `passes` forward passes (empty
    ones after the rows): a sharded model's forward is collective, so every rank runs as many."""
    was_training = model.training
    model.eval()
    out = []
    for s in range(0, len(rows), batch):
        feats = Features.from_rows(rows.slice(s, s + batch)).to(device)
        out.append(torch.sigmoid(model(feats).float()).cpu().numpy())
    for _ in range(passes - len(out)):
        model(Features.from_rows(rows.slice(0, 0)).to(device))
    model.train(was_training)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)


def auc_logloss(labels: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    if len(labels) == 0:
        return math.nan, math.nan
    p = np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7)
    y = labels.astype(np.float64)
    ll = float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())
    return roc_auc(y, p), ll
