"""The exported model: `<run_dir>/export/model.pt` (CPU tensors) and `model.json` (its lineage).

`model.pt` holds the weights, the buffers (dense statistics, the id -> row maps of managed tables)
and the feature spec: `load_exported` rebuilds the model from the file alone, and it maps ids to
rows exactly as training did.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import torch

from slipstream.errors import ConfigError
from slipstream.samples.schema import SCHEMA_VERSION
from trainers.checkpoint.store import atomic_torch_save, atomic_write_text
from slipstream.samples.spec import Spec, spec_from_dict
from trainers.config.schema import ModelConfig, TrainConfig
from trainers.models.base import RecModel
from trainers.models.zoo import ZOO

log = logging.getLogger(__name__)


def export_model(model: torch.nn.Module, cfg: TrainConfig, spec: Spec, run_dir: Path, *, step: int, phase: str,
                 positions: Mapping[int, int], metrics: Mapping[str, Any] | None = None) -> Path:
    """Write the model and what it was trained on; returns the path of `model.pt`. The feature
    spec travels with the weights: `load_exported` rebuilds the model from the file alone."""
    d = run_dir / "export"
    d.mkdir(parents=True, exist_ok=True)
    cpu_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # loadable without a GPU
    atomic_torch_save({"state_dict": cpu_state, "model_config": cfg.to_dict()["model"],
                       "schema_version": SCHEMA_VERSION, "spec": spec.to_json()}, d / "model.pt")
    info = {"run_id": cfg.run.run_id, "schema_version": SCHEMA_VERSION, "model_class": cfg.model.class_path or f"trainers.models.zoo:{ZOO[cfg.model.kind].__name__}",
            "model_config": cfg.to_dict()["model"], "snapshot_id": cfg.data.snapshot_id,
            "spec": {"name": spec.name, "version": spec.version, "digest": spec.digest},
            "t_handoff": cfg.data.t_handoff.isoformat(), "step": step, "phase": phase,
            "positions": {str(k): v for k, v in positions.items()},
            "exported_at": datetime.now(timezone.utc).isoformat(),
            "metrics": {k: (metrics or {}).get(k) for k in ("auc", "logloss", "auc_after_t")}}
    atomic_write_text(d / "model.json", json.dumps(info, indent=2, default=str))
    log.info("exported the model to %s", d)
    return d / "model.pt"


def load_exported(path: Path | str, device: torch.device | str = "cpu") -> tuple[RecModel, Spec]:
    """The exported model (in eval mode) and its feature spec, from `model.pt` alone (no code is
    unpickled). Its managed tables' maps are the trained ones: it scores rows as training saw them."""
    from trainers.models import build_model

    blob = torch.load(Path(path), map_location="cpu", weights_only=True)
    raw_spec = blob.get("spec")
    if not isinstance(raw_spec, str):
        raise ConfigError(f"{path} carries no feature spec: it was exported by an older Slipstream; score it with that version")
    spec = spec_from_dict(json.loads(raw_spec), str(path))
    model = build_model(spec, ModelConfig(**blob["model_config"]), 0)
    model.load_state_dict(blob["state_dict"])
    return model.to(device).eval(), spec
