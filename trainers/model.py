"""The CTR model: DLRM-style with DeepFM's first-order terms.

- dense features -> bottom MLP -> one `embed_dim` vector;
- user id, item id and each hashed categorical -> an embedding (id mod buckets: hashing keeps
  tables bounded whatever the id space);
- the user's history of item ids -> `embedding_bag` (mean) over the item table through offsets,
  so a variable-length sequence costs no padding, and a history item shares its vector with the
  same item as a candidate;
- pairwise dot products of all those vectors (the FM/DLRM interaction) plus the dense vector
  -> top MLP -> logit, plus first-order biases per id/category and a linear term on the dense
  features (the "wide" part).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from slipstream.samples.schema import CATEGORICAL_COLUMNS, DENSE_COLUMNS
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


class CTRModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.embed_dim
        self.cfg = cfg
        n_cat = len(CATEGORICAL_COLUMNS)
        self.user = nn.Embedding(cfg.user_buckets, d)
        self.item = nn.Embedding(cfg.item_buckets, d)
        self.cats = nn.ModuleList(nn.Embedding(cfg.category_buckets, d) for _ in range(n_cat))
        self.user_bias = nn.Embedding(cfg.user_buckets, 1)
        self.item_bias = nn.Embedding(cfg.item_buckets, 1)
        self.cat_bias = nn.ModuleList(nn.Embedding(cfg.category_buckets, 1) for _ in range(n_cat))
        self.bottom = _mlp([len(DENSE_COLUMNS), *cfg.bottom_mlp, d], final_activation=True)
        self.wide = nn.Linear(len(DENSE_COLUMNS), 1)
        n_vec = 1 + 2 + n_cat + 1  # dense vector, user, item, categoricals, history
        self.n_inter = n_vec * (n_vec - 1) // 2
        self.top = _mlp([d + self.n_inter, *cfg.top_mlp, 1], final_activation=False, dropout=cfg.dropout)
        rows, cols = torch.triu_indices(n_vec, n_vec, offset=1)
        self.register_buffer("_iu_rows", rows, persistent=False)
        self.register_buffer("_iu_cols", cols, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Small embeddings: dot products of N(0, 1) vectors would start the interactions saturated.
        for emb in [self.user, self.item, *self.cats]:
            nn.init.normal_(emb.weight, std=0.05)
        for emb in [self.user_bias, self.item_bias, *self.cat_bias]:
            nn.init.zeros_(emb.weight)

    def forward(self, x: Features) -> torch.Tensor:
        c = self.cfg
        user = torch.remainder(x.user, c.user_buckets)
        item = torch.remainder(x.item, c.item_buckets)
        cats = torch.remainder(x.cats, c.category_buckets)
        hist = torch.remainder(x.hist_values, c.item_buckets)
        dense_vec = self.bottom(x.dense)
        vecs = [dense_vec, self.user(user), self.item(item)]
        vecs += [emb(cats[:, j]) for j, emb in enumerate(self.cats)]
        vecs.append(F.embedding_bag(hist, self.item.weight, x.hist_offsets, mode="mean"))
        stacked = torch.stack(vecs, dim=1)  # (n, n_vec, d)
        inter = torch.bmm(stacked, stacked.transpose(1, 2))[:, self._iu_rows, self._iu_cols]
        logit = self.top(torch.cat([dense_vec, inter], dim=1)).squeeze(1)
        first_order = self.user_bias(user) + self.item_bias(item) + self.wide(x.dense)
        for j, emb in enumerate(self.cat_bias):
            first_order = first_order + emb(cats[:, j])
        return logit + first_order.squeeze(1)


def build_model(cfg: ModelConfig, seed: int) -> CTRModel:
    # Same init on every rank (DDP also broadcasts rank 0's weights, this keeps runs reproducible).
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = CTRModel(cfg)
    torch.random.set_rng_state(gen_state)
    return model


ID_TABLES = ("user", "item", "user_bias", "item_bias")
"""Per-id tables: one row per user or item bucket, each row trained only by its own samples."""


def param_groups(model: CTRModel, id_weight_decay: float | None = None) -> list[dict[str, object]]:
    """Two optimizer groups, named so a phase can give them different learning rates: the per-id
    tables (`ids`) and everything shared by all samples (`shared`: MLPs, wide part, categoricals).
    `id_weight_decay` (None: the optimizer's `weight_decay`) is the ids group's own L2."""
    ids = [p for n, p in model.named_parameters() if n.split(".")[0] in ID_TABLES and p.requires_grad]
    shared = [p for n, p in model.named_parameters() if n.split(".")[0] not in ID_TABLES and p.requires_grad]
    id_group: dict[str, object] = {"params": ids, "name": "ids"}
    if id_weight_decay is not None:
        id_group["weight_decay"] = id_weight_decay
    return [id_group, {"params": shared, "name": "shared"}]


def build_optimizer(model: CTRModel, name: str, lr: float, weight_decay: float,
                    id_weight_decay: float | None = None) -> torch.optim.Optimizer:
    """`id_weight_decay` is the L2 of the per-id tables (None: `weight_decay`). With Adam (coupled)
    it is a Gaussian prior on every user's and item's vectors and bias, applied to all rows each
    step as the mean loss's penalty would be: an id seen a few times stays near 0, a frequent one
    is set by its data (measured: docs/trainer.md, Model quality)."""
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
    docs/trainer.md)."""
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
