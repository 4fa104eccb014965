"""The CTR model: DLRM-style with DeepFM's first-order terms, its inputs and tables from the
feature spec.

- dense features -> (standardised where the spec says so, with the training window's statistics)
  -> bottom MLP -> one `embed_dim` vector;
- each id and categorical feature -> an embedding of its own table (value mod buckets: hashing
  keeps tables bounded whatever the id space);
- each list or sequence feature -> `embedding_bag` (mean) through offsets, so a variable-length
  list costs no padding; a list that `shares` an id's table (a history of item ids) looks its
  values up in that table, so a history item shares its vector with the same item as a candidate;
- pairwise dot products of all those vectors (the FM/DLRM interaction) plus the dense vector
  -> top MLP -> logit, plus first-order biases per id/category and a linear term on the dense
  features (the "wide" part).
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from slipstream.samples.spec import Spec
from trainers.config import ModelConfig
from trainers.rows import Features


def _mlp(widths: list[int], final_activation: bool, dropout: float = 0.0) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        last = i == len(widths) - 2
        if not last or final_activation:
            layers.append(nn.ReLU())
            if dropout and not last:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def table_sizes(spec: Spec, overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """Rows of each embedding table: the spec's `buckets`, or `model.buckets` where it names the
    feature (an experiment, a benchmark with a large table). Lists that share a table have none."""
    sizes = {}
    for f in spec.features:
        if f.is_sparse or (f.is_list and f.shares is None):
            sizes[f.name] = int((overrides or {}).get(f.name) or f.buckets or 1)
    return sizes


class CTRModel(nn.Module):
    def __init__(self, spec: Spec, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.embed_dim
        self.cfg = cfg
        self.sizes = table_sizes(spec, cfg.buckets)
        self.sparse_names = [f.name for f in spec.sparse]
        self.list_tables = [spec.table_of(f) for f in spec.lists]
        self.id_features = {f.name for f in spec.features if f.kind == "id"}
        n_dense = len(spec.dense)
        self.tables = nn.ModuleDict({name: nn.Embedding(n, d) for name, n in self.sizes.items()})
        self.biases = nn.ModuleDict({name: nn.Embedding(self.sizes[name], 1) for name in self.sparse_names})
        self.bottom = _mlp([n_dense, *cfg.bottom_mlp, d], final_activation=True) if n_dense else None
        self.wide = nn.Linear(n_dense, 1) if n_dense else None
        n_vec = (1 if n_dense else 0) + len(self.sparse_names) + len(self.list_tables)
        self.n_inter = n_vec * (n_vec - 1) // 2
        self.top = _mlp([(d if n_dense else 0) + self.n_inter, *cfg.top_mlp, 1], final_activation=False, dropout=cfg.dropout)
        rows, cols = torch.triu_indices(n_vec, n_vec, offset=1)
        self.register_buffer("_iu_rows", rows, persistent=False)
        self.register_buffer("_iu_cols", cols, persistent=False)
        standardized = torch.tensor([f.standardize for f in spec.dense], dtype=torch.bool)
        self.register_buffer("dense_standardized", standardized, persistent=False)
        self.register_buffer("dense_mean", torch.zeros(n_dense))
        self.register_buffer("dense_std", torch.ones(n_dense))
        self.register_buffer("_sizes", torch.tensor([self.sizes[n] for n in self.sparse_names], dtype=torch.int64),
                             persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Small embeddings: dot products of N(0, 1) vectors would start the interactions saturated.
        for emb in self.tables.values():
            nn.init.normal_(emb.weight, std=0.05)
        for emb in self.biases.values():
            nn.init.zeros_(emb.weight)

    def set_dense_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """The training window's mean and standard deviation of each dense feature; applied to the
        standardised ones (`standardize: true` in the spec), stored with the model's weights."""
        std = torch.where(std > 1e-12, std, torch.ones_like(std))
        self.dense_mean.copy_(torch.where(self.dense_standardized, mean, torch.zeros_like(mean)))
        self.dense_std.copy_(torch.where(self.dense_standardized, std, torch.ones_like(std)))

    def forward(self, x: Features) -> torch.Tensor:
        ids = torch.remainder(x.sparse, self._sizes)
        vecs = []
        first_order = torch.zeros(ids.shape[0], 1, device=ids.device)
        dense_vec = None
        if self.bottom is not None:
            dense = (x.dense - self.dense_mean) / self.dense_std
            dense_vec = self.bottom(dense)
            vecs.append(dense_vec)
            first_order = first_order + self.wide(dense)  # type: ignore[misc]
        for j, name in enumerate(self.sparse_names):
            vecs.append(self.tables[name](ids[:, j]))
            first_order = first_order + self.biases[name](ids[:, j])
        for table, values, offsets in zip(self.list_tables, x.list_values, x.list_offsets):
            weight = self.tables[table].weight
            vecs.append(F.embedding_bag(torch.remainder(values, weight.shape[0]), weight, offsets, mode="mean"))
        stacked = torch.stack(vecs, dim=1)  # (n, n_vec, d)
        inter = torch.bmm(stacked, stacked.transpose(1, 2))[:, self._iu_rows, self._iu_cols]
        top_in = torch.cat([dense_vec, inter], dim=1) if dense_vec is not None else inter
        return self.top(top_in).squeeze(1) + first_order.squeeze(1)


def build_model(spec: Spec, cfg: ModelConfig, seed: int) -> CTRModel:
    # Same init on every rank (DDP also broadcasts rank 0's weights, this keeps runs reproducible).
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = CTRModel(spec, cfg)
    torch.random.set_rng_state(gen_state)
    return model


def is_id_param(model: CTRModel, name: str) -> bool:
    """Per-id parameters: the tables and biases of id features, each row trained only by its own
    samples (a user's, an item's). Everything else is shared by all samples."""
    parts = name.split(".")
    return parts[0] in ("tables", "biases") and len(parts) > 1 and parts[1] in model.id_features


def param_groups(model: CTRModel, id_weight_decay: float | None = None) -> list[dict[str, object]]:
    """Two optimizer groups, named so a phase can give them different learning rates: the per-id
    tables (`ids`) and everything shared by all samples (`shared`: MLPs, wide part, categoricals).
    `id_weight_decay` (None: the optimizer's `weight_decay`) is the ids group's own L2."""
    ids = [p for n, p in model.named_parameters() if is_id_param(model, n) and p.requires_grad]
    shared = [p for n, p in model.named_parameters() if not is_id_param(model, n) and p.requires_grad]
    id_group: dict[str, object] = {"params": ids, "name": "ids"}
    if id_weight_decay is not None:
        id_group["weight_decay"] = id_weight_decay
    return [id_group, {"params": shared, "name": "shared"}]


def build_optimizer(model: CTRModel, name: str, lr: float, weight_decay: float,
                    id_weight_decay: float | None = None) -> torch.optim.Optimizer:
    """`id_weight_decay` is the L2 of the per-id tables (None: `weight_decay`). With Adam (coupled)
    it is a Gaussian prior on every user's and item's vectors and bias, applied to all rows each
    step as the mean loss's penalty would be: an id seen a few times stays near 0, a frequent one
    is set by its data (measured: docs/benchmarks.md, Model quality)."""
    params = param_groups(model, id_weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, momentum=0.9)


def phase_lrs(lr: float, stream_lr: float, batch_size: int, stream_batch_size: int, phase: str,
              drift: float = 1.0) -> dict[str, float]:
    """Learning rate per group in a phase. Batch phase: `lr` everywhere. Stream phase: the id
    tables keep their batch-phase rate *per sample* (`lr * stream_batch_size / batch_size`): Adam's
    step barely depends on the batch size, so smaller stream batches at the same rate would move
    every user and item row several times as far per sample and wash out what the window taught
    them. The shared group goes from that same per-sample rate (`drift` 0: the stream looks like
    the window, its samples only add data) to `stream_lr` (`drift` 1, 0: `lr`), so what a change
    of the click model moves adapts within a few thousand fresh samples; `drift` is
    `trainers.drift.DriftGauge.level`, or 1 with `optim.adaptive_stream_lr` off (measured:
    docs/benchmarks.md)."""
    if phase == "batch":
        return {"ids": lr, "shared": lr}
    per_sample = lr * min(1.0, stream_batch_size / batch_size)
    high = stream_lr or lr
    return {"ids": per_sample, "shared": per_sample + min(1.0, max(0.0, drift)) * (high - per_sample)}


def set_lrs(opt: torch.optim.Optimizer, lrs: dict[str, float]) -> None:
    """Apply `phase_lrs`: a pure function of the config and the phase, so a resumed run sets the
    same rates whatever its checkpoint's optimizer state says."""
    for group in opt.param_groups:
        group["lr"] = lrs[group["name"]]
