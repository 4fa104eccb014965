"""Judging a model on an evaluation set: the model, its baselines, the batch-only model, the
champion and the generator's truth scored on the same rows, each AUC and each difference with a
95% interval from one bootstrap over users (`slipstream.scoring.UserBootstrap`: rows of one user
are not independent), as the `EvalSet` of metrics.json (`slipstream.pipeline.run_metrics`).

`slipstream.pipeline.registry.decide_promotion` reads the forward tail's `EvalSet`; this module
computes it where torch and the rows are. `load_champion` brings the registry's champion to
re-score it on the same rows in the same step.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Mapping

import numpy as np
import torch

from slipstream.pipeline.registry import ModelRegistry, RegistryConfig
from slipstream.pipeline.run_metrics import AucScore, Difference, EvalSet
from slipstream.samples.spec import Spec, spec_from_dict
from slipstream.scoring import UserBootstrap, logloss
from slipstream.settings import Settings
from trainers.config.schema import ModelConfig

log = logging.getLogger(__name__)

def load_champion(settings: Settings, spec: Spec, model_cfg: ModelConfig, run_id: str,
                  device: torch.device) -> tuple[str | None, torch.nn.Module | None, str]:
    """(champion run id, its model on `device`, why not) — the model is None when there is no
    champion, it is this run, its package cannot be read, or it was trained on another feature
    spec (its inputs would not match these rows)."""
    from trainers.models import build_model

    try:
        registry = ModelRegistry(RegistryConfig.from_env(settings).location)
        champion = registry.champion()
    except Exception as e:  # noqa: BLE001  (an unreachable registry must not fail the run)
        return None, None, f"the registry could not be read ({e})"
    if not champion:
        return None, None, "no champion yet"
    champ_id = str(champion.get("run_id"))
    if champ_id == run_id:
        return champ_id, None, "this run is the champion"
    try:
        blob = torch.load(io.BytesIO(registry.model_bytes(champ_id)), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001
        return champ_id, None, f"the champion's model could not be loaded ({e})"
    raw_spec = blob.get("spec")
    if not isinstance(raw_spec, str):
        return champ_id, None, "the champion was exported before models carried their feature spec"
    champ_spec = spec_from_dict(json.loads(raw_spec), f"champion {champ_id}")
    if champ_spec.digest != spec.digest:
        return champ_id, None, (f"the champion was trained on spec {champ_spec.name} v{champ_spec.version} "
                                f"({champ_spec.digest}), this run on {spec.name} v{spec.version} ({spec.digest})")
    try:
        model = build_model(champ_spec, ModelConfig(**blob["model_config"]), 0)
        model.load_state_dict(blob["state_dict"])
    except Exception as e:  # noqa: BLE001  (a champion of an older model layout must not fail the run)
        return champ_id, None, f"the champion's model could not be rebuilt ({e})"
    return champ_id, model.to(device), ""


def judge(labels: np.ndarray, users: np.ndarray, probs: Mapping[str, np.ndarray | None], seed: int = 0,
          logloss_of: tuple[str, ...] = ("model", "baseline", "batch_only", "champion")) -> EvalSet:
    """One evaluation set's `EvalSet`: every model in `probs` (model, baseline, popularity,
    batch_only, champion, best; None or NaN scores: not scored) on the same rows, each AUC with
    its interval and the model's differences with their paired intervals, all from one bootstrap
    over users."""
    boot = UserBootstrap(labels, users, seed=seed)
    given = {k: p for k, p in probs.items() if p is not None and len(p) == len(labels) and np.isfinite(p).all()}
    fields: dict[str, object] = {"rows": boot.rows, "users": boot.users, "positives": boot.positives}
    for name, p in given.items():
        fields[name] = AucScore.of(boot.auc(p), logloss(labels, p) if name in logloss_of else None)
    model = given.get("model")
    if model is not None:
        for other, key in (("baseline", "vs_baseline"), ("champion", "vs_champion"), ("batch_only", "vs_batch_only")):
            if other in given:
                fields[key] = Difference.of(boot.diff(model, given[other]))
        if "best" in given:
            fields["best_gap"] = Difference.of(boot.diff(given["best"], model))
    return EvalSet.model_validate(fields)
