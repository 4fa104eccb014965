"""Models: the zoo (`model.kind`) or a user's class (`model.class=package.module:Class`), built
from the feature spec. The interface a model implements: `trainers.models.base.RecModel`."""

from __future__ import annotations

import importlib

import torch

from slipstream.errors import ConfigError
from slipstream.samples.spec import Spec
from trainers.config.schema import ModelConfig
from trainers.models.base import RecModel
from trainers.models.tables import table_sizes
from trainers.models.zoo import ZOO

__all__ = ["RecModel", "ZOO", "build_model", "model_class", "table_sizes"]


def model_class(cfg: ModelConfig) -> type[RecModel]:
    """The class `model.class` names (`package.module:Class`, importable on every rank), else the
    zoo's `model.kind`."""
    if not cfg.class_path:
        return ZOO[cfg.kind]
    module_name, _, attr = cfg.class_path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"model.class={cfg.class_path!r} cannot be imported ({e}): give package.module:Class, "
                          "importable on PYTHONPATH on every rank") from None
    if not (isinstance(cls, type) and issubclass(cls, RecModel)):
        raise ConfigError(f"model.class={cfg.class_path!r} is not a subclass of trainers.models.RecModel: "
                          "subclass it and implement logits(dense, emb) (docs/trainer.md, Models)")
    return cls


def build_model(spec: Spec, cfg: ModelConfig, seed: int) -> RecModel:
    # Same init on every rank (DDP also broadcasts rank 0's weights, this keeps runs reproducible).
    cls = model_class(cfg)
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = cls(spec, cfg)
    finally:
        torch.random.set_rng_state(gen_state)
    return model
