"""The model zoo: `model.kind` = dlrm | dcn_v2 | deepfm | wide_deep, all over the spec's tables.

- `dlrm`: dense -> bottom MLP -> one vector; pairwise dot products of it and every feature's vector
  (the FM/DLRM interaction) plus the dense vector -> top MLP; first-order terms (DeepFM's per-id
  weights, a linear dense term). The trainer's model before the zoo, ported.
- `dcn_v2`: every vector and the dense features concatenated -> `cross_layers` full-rank cross
  layers (x_{l+1} = x_0 * (W x_l + b) + x_l) -> top MLP (DCN-V2, the stacked variant).
- `deepfm`: FM (first-order weights + the sum of pairwise dot products of the feature vectors,
  computed as ((sum v)^2 - sum v^2) / 2) + a deep MLP over the vectors and dense features.
- `wide_deep`: wide (first-order weights + linear dense) + deep MLP over vectors and dense features.
"""

from __future__ import annotations

import torch
from torch import nn

from slipstream.samples.spec import Spec
from trainers.config.schema import ModelConfig
from trainers.models.base import RecModel, mlp


class DLRM(RecModel):
    def __init__(self, spec: Spec, cfg: ModelConfig) -> None:
        super().__init__(spec, cfg, first_order=True)
        d = cfg.embed_dim
        self.bottom = mlp([self.n_dense, *cfg.bottom_mlp, d], final_activation=True) if self.n_dense else None
        n_vec = (1 if self.n_dense else 0) + len(self.tables.keys)
        rows, cols = torch.triu_indices(n_vec, n_vec, offset=1)
        self.register_buffer("_iu_rows", rows, persistent=False)
        self.register_buffer("_iu_cols", cols, persistent=False)
        self.top = mlp([(d if self.n_dense else 0) + len(rows), *cfg.top_mlp, 1], final_activation=False,
                       dropout=cfg.dropout)

    def logits(self, dense: torch.Tensor | None, emb: dict[str, torch.Tensor]) -> torch.Tensor:
        vecs = [emb[k] for k in self.tables.keys]
        dense_vec = self.bottom(dense) if self.bottom is not None and dense is not None else None
        if dense_vec is not None:
            vecs.insert(0, dense_vec)
        stacked = torch.stack(vecs, dim=1)  # (n, n_vec, d)
        inter = torch.bmm(stacked, stacked.transpose(1, 2))[:, self._iu_rows, self._iu_cols]
        top_in = torch.cat([dense_vec, inter], dim=1) if dense_vec is not None else inter
        return self.top(top_in).squeeze(1)


class _Deep(RecModel):
    """Shared by the models whose deep part reads every vector and the dense features side by side."""

    def __init__(self, spec: Spec, cfg: ModelConfig, first_order: bool) -> None:
        super().__init__(spec, cfg, first_order=first_order)
        self.width = self.n_dense + cfg.embed_dim * len(self.tables.keys)

    def flat(self, dense: torch.Tensor | None, emb: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [emb[k] for k in self.tables.keys]
        return torch.cat(([dense] if dense is not None else []) + parts, dim=1)


class DCNv2(_Deep):
    def __init__(self, spec: Spec, cfg: ModelConfig) -> None:
        super().__init__(spec, cfg, first_order=False)
        self.cross = nn.ModuleList(nn.Linear(self.width, self.width) for _ in range(cfg.cross_layers))
        for layer in self.cross:  # start near the identity: x0 * (0 x + 0) + x
            nn.init.zeros_(layer.bias)
            nn.init.normal_(layer.weight, std=0.01)
        self.top = mlp([self.width, *cfg.top_mlp, 1], final_activation=False, dropout=cfg.dropout)

    def logits(self, dense: torch.Tensor | None, emb: dict[str, torch.Tensor]) -> torch.Tensor:
        x0 = x = self.flat(dense, emb)
        for layer in self.cross:
            x = x0 * layer(x) + x
        return self.top(x).squeeze(1)


class DeepFM(_Deep):
    def __init__(self, spec: Spec, cfg: ModelConfig) -> None:
        super().__init__(spec, cfg, first_order=True)
        self.deep = mlp([self.width, *cfg.top_mlp, 1], final_activation=False, dropout=cfg.dropout)

    def logits(self, dense: torch.Tensor | None, emb: dict[str, torch.Tensor]) -> torch.Tensor:
        v = torch.stack([emb[k] for k in self.tables.keys], dim=1)  # (n, fields, d)
        fm = 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1)
        return fm + self.deep(self.flat(dense, emb)).squeeze(1)


class WideDeep(_Deep):
    def __init__(self, spec: Spec, cfg: ModelConfig) -> None:
        super().__init__(spec, cfg, first_order=True)
        self.deep = mlp([self.width, *cfg.top_mlp, 1], final_activation=False, dropout=cfg.dropout)

    def logits(self, dense: torch.Tensor | None, emb: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.deep(self.flat(dense, emb)).squeeze(1)


ZOO: dict[str, type[RecModel]] = {"dlrm": DLRM, "dcn_v2": DCNv2, "deepfm": DeepFM, "wide_deep": WideDeep}
