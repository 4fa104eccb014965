"""The scores that decide a model's promotion: on rows after T (the future: neither the model nor
its baselines nor the current champion trained on them), the model against its logistic baseline,
item popularity and the champion re-scored on the same rows, each difference with a confidence
interval from a bootstrap over users (rows of one user are not independent).

`slipstream.pipeline.registry.decide_promotion` reads these numbers from metrics.json; this module
computes them where torch and the rows are (the trainer's finish).
"""

from __future__ import annotations

import io
import json
import logging
import math
from typing import Any

import numpy as np
import torch

from slipstream.pipeline.registry import ModelRegistry, RegistryConfig
from slipstream.samples.spec import Spec, spec_from_dict
from slipstream.scoring import auc
from slipstream.settings import Settings
from trainers.config.schema import ModelConfig

log = logging.getLogger(__name__)

BOOTSTRAP_ROUNDS = 200
CONFIDENCE = 0.95


def bootstrap_diff(labels: np.ndarray, p_a: np.ndarray, p_b: np.ndarray, groups: np.ndarray,
                   rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0) -> dict[str, float]:
    """AUC(p_a) − AUC(p_b) on the rows, and its 95% interval from resampling whole groups (users)
    with replacement. NaN where the rows hold one class only."""
    diff = auc(labels, p_a) - auc(labels, p_b)
    out = {"diff": diff, "lo": math.nan, "hi": math.nan}
    if not math.isfinite(diff) or len(labels) < 10:
        return out
    uniq, inverse = np.unique(groups, return_inverse=True)
    members = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[members], np.arange(len(uniq)))
    sizes = np.bincount(inverse, minlength=len(uniq))
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(rounds):
        pick = rng.integers(0, len(uniq), len(uniq))
        rows = np.concatenate([members[starts[g]:starts[g] + sizes[g]] for g in pick])
        d = auc(labels[rows], p_a[rows]) - auc(labels[rows], p_b[rows])
        if math.isfinite(d):
            diffs.append(d)
    if len(diffs) >= rounds // 2:
        tail = (1 - CONFIDENCE) / 2
        out["lo"], out["hi"] = (float(x) for x in np.quantile(diffs, [tail, 1 - tail]))
    return out


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


def judged(labels: np.ndarray, users: np.ndarray, model: np.ndarray, baseline: np.ndarray,
           popularity: np.ndarray | None, champion: np.ndarray | None) -> dict[str, Any]:
    """The after-T comparisons, for metrics.json."""
    out: dict[str, Any] = {}
    vs_base = bootstrap_diff(labels, model, baseline, users)
    out.update(auc_diff_vs_baseline=vs_base["diff"], auc_diff_vs_baseline_ci=[vs_base["lo"], vs_base["hi"]])
    if popularity is not None and np.isfinite(popularity).all():
        out["popularity_auc_after_t"] = auc(labels, popularity)
    if champion is not None:
        vs_champ = bootstrap_diff(labels, model, champion, users, seed=1)
        out.update(champion_auc_after_t=auc(labels, champion), auc_diff_vs_champion=vs_champ["diff"],
                   auc_diff_vs_champion_ci=[vs_champ["lo"], vs_champ["hi"]])
    return out
