"""What every model of the trainer shares, a zoo model's or a user's (`model.class`).

A model is a `RecModel` subclass built as `Class(spec, cfg)` (`cfg`: `trainers.config.schema.ModelConfig`)
that implements `logits(dense, emb)`:

- `dense`: (n, D) float32, the spec's dense features in `spec.dense` order, already standardised
  where the spec says so (with the training window's statistics, saved with the weights), or None
  when the spec has none;
- `emb`: each id / categorical / list / sequence feature's pooled vector, (n, cfg.embed_dim), by
  feature name (`self.tables.keys`: the single-valued features, then the lists);
- returns (n,) logits (the trainer applies the sigmoid inside its loss).

The base class owns the embedding tables (`self.tables`, TorchRec modules the trainer shards or
trains with sparse gradients) and the first-order terms when built with `first_order=True`
(per-id weights of the single-valued features plus a linear term on the dense features, added to
what `logits` returns). Everything else, the interaction and the MLPs, is the subclass's.
"""

from __future__ import annotations

import torch
from torch import nn

from slipstream.samples.spec import Spec
from trainers.config.schema import ModelConfig
from trainers.models.tables import MIN_SHARDED_DIM, SpecTables
from trainers.data.rows import Features


def mlp(widths: list[int], final_activation: bool, dropout: float = 0.0) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        last = i == len(widths) - 2
        if not last or final_activation:
            layers.append(nn.ReLU())
            if dropout and not last:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


class RecModel(nn.Module):
    def __init__(self, spec: Spec, cfg: ModelConfig, *, first_order: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_dense = len(spec.dense)
        self.tables = SpecTables(spec, cfg.embed_dim, cfg.buckets, first_order,
                                 bias_dim=1 if cfg.sharding == "none" else MIN_SHARDED_DIM)
        self.wide = nn.Linear(self.n_dense, 1) if first_order and self.n_dense else None
        standardized = torch.tensor([f.standardize for f in spec.dense], dtype=torch.bool)
        self.register_buffer("dense_standardized", standardized, persistent=False)
        self.register_buffer("dense_mean", torch.zeros(self.n_dense))
        self.register_buffer("dense_std", torch.ones(self.n_dense))

    def set_dense_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """The training window's mean and standard deviation of each dense feature; applied to the
        standardised ones (`standardize: true` in the spec), stored with the model's weights. `mean`
        and `std` may live anywhere (the trainer computes them on the CPU): they go to the model's device."""
        mean, std = mean.to(self.dense_mean.device), std.to(self.dense_std.device)
        std = torch.where(std > 1e-12, std, torch.ones_like(std))
        self.dense_mean.copy_(torch.where(self.dense_standardized, mean, torch.zeros_like(mean)))
        self.dense_std.copy_(torch.where(self.dense_standardized, std, torch.ones_like(std)))

    def forward(self, x: Features) -> torch.Tensor:
        dense = (x.dense - self.dense_mean) / self.dense_std if self.n_dense else None
        kjt = self.tables.kjt(x)
        out = self.logits(dense, self.tables(kjt))
        first = self.tables.first_order(kjt)
        if first is not None:
            out = out + first
        if self.wide is not None and dense is not None:
            out = out + self.wide(dense).squeeze(1)
        return out

    def logits(self, dense: torch.Tensor | None, emb: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement logits(dense, emb) -> (n,) logits")
