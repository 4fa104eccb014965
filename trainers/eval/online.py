"""The stream phase's evaluator: every step's fresh rows scored before the step trains on them.

`StreamEvaluator.score_step` runs between taking a batch and training it, on every rank: one
forward pass of the live model in eval mode over the fresh rows and the drift gauge's reference
rows together (collective for a sharded model: every rank runs the same passes), the logistic
baseline and the batch-only model over the fresh rows, popularity from the counts so far and the
generator's truth where known; the scores go to `PrequentialScores` (`trainers.eval.prequential`).

The drift gauge's reference: rows of the validation days, which no model trains on, drawn anew
each step from a generator seeded by (seed, rank, step), so a resumed run draws the same ones;
without validation days the replayed rows of the step serve, as their training losses.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from slipstream.pipeline.run_metrics import EvalSet
from slipstream.samples.spec import Spec
from trainers.config.schema import ModelConfig
from trainers.data.rows import DEFAULT_LAYOUT, RowLayout, Rows
from trainers.eval.baselines import Baselines
from trainers.eval.prequential import PrequentialScores, gather_columns, judge_columns
from trainers.eval.scoring import SCORE_BATCH, score, user_groups
from trainers.eval.truth import GeneratorTruth
from trainers.models import build_model

log = logging.getLogger(__name__)


class StreamEvaluator:
    def __init__(self, spec: Spec, device: torch.device, max_rows: int, rank: int, world: int, seed: int,
                 layout: RowLayout = DEFAULT_LAYOUT) -> None:
        self.spec, self.device, self.rank, self.seed = spec, device, rank, seed
        self.scores = PrequentialScores(max(1, max_rows // world), rank, world)
        self.batch_only: nn.Module | None = None
        """A frozen copy of the model at the handoff (None: a sharded model, too large to copy per rank)."""
        self.truth: GeneratorTruth | None = None
        self.reference = Rows.empty(layout)
        """Rows the drift gauge compares the fresh rows with (this rank's validation rows)."""

    def prepare(self, batch_only: Path | None, model_cfg: ModelConfig, reference: Rows, manifest: str, t_us: int) -> None:
        """Before the stream phase (also after a resume in it): the batch-only model from its file
        (None: not scored per step), the drift gauge's reference rows and the generator's truth."""
        if batch_only is not None and self.batch_only is None:
            m = build_model(self.spec, model_cfg, self.seed).to(self.device)
            m.load_state_dict(torch.load(batch_only, map_location="cpu", weights_only=True)["model"])
            self.set_batch_only(m)
        self.reference = reference
        self.truth = GeneratorTruth.load(manifest, after_us=t_us)

    def set_batch_only(self, model: nn.Module | None) -> None:
        self.batch_only = model
        if model is not None:
            model.eval()
            for p in model.parameters():
                p.requires_grad_(False)

    def passes(self, fresh_max: int, reference_max: int) -> int:
        """Forward passes per step: fixed by the config, so every rank runs the same number."""
        return max(1, -(-(fresh_max + reference_max) // SCORE_BATCH))

    def draw_reference(self, n: int, step: int) -> Rows:
        if n <= 0 or not len(self.reference):
            return self.reference.slice(0, 0)
        rng = np.random.default_rng([self.seed, self.rank, step, 71])
        return self.reference.take(rng.integers(0, len(self.reference), n))

    @torch.no_grad()
    def score_step(self, model: nn.Module, baselines: Baselines, fresh: Rows, reference: Rows,
                   passes: int, step: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Collective: score `fresh` (and `reference`, in the same forward pass) with the live model
        before the step; record every model's scores of `fresh`. Returns the model's
        probabilities of `fresh` and of `reference`."""
        both = Rows.concat([fresh, reference]) if len(reference) else fresh
        p = score(model, both, self.device, passes=passes)
        p_fresh, p_ref = p[: len(fresh)], p[len(fresh):]
        if not len(fresh):
            return p_fresh, p_ref
        probs: dict[str, Any] = {"model": p_fresh, "baseline": score(baselines.logistic, fresh, self.device)}
        if self.batch_only is not None:
            probs["batch_only"] = score(self.batch_only, fresh, self.device)
        pop = baselines.popularity
        if pop.available:  # the counts so far: the rows this rank trained, none of this step's yet
            probs["popularity"] = pop.score(fresh, pop.views, pop.clicks)
        if self.truth is not None:
            probs["best"] = self.truth.lookup(fresh.sample_id)
        self.scores.add(fresh.label, user_groups(fresh, self.spec), fresh.event_us, step, **probs)
        return p_fresh, p_ref


def row_logloss(labels: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Each row's binary cross-entropy (nats)."""
    p = np.clip(probs, 1e-7, 1 - 1e-7)
    y = labels.astype(np.float64)
    loss: np.ndarray = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    return loss


def live_set(scores: PrequentialScores, gather: Any, is_main: bool) -> EvalSet | None:
    """Collective: the prequential scores since the last export (rank 0; None elsewhere or when empty)."""
    cols = gather_columns(gather, scores.columns(since_live=True))
    scores.mark_live()
    if not is_main or not len(cols["label"]):
        return None
    return judge_columns(cols)
