"""The baselines every run is judged against, fitted on exactly the rows the model trains on.

- `LogisticBaseline`: a logistic regression on the same features — one weight per hashed id and
  categorical value (the spec's table sizes), the mean weight of a list's values, a linear term on
  the (standardised) dense features — trained with Adagrad one step per model step, on the same
  batches (DDP-averaged like the model). What a careful engineer fits first; a model that does
  not beat it on the future is not promoted.
- `PopularityBaseline`: each item's smoothed click rate over the training rows (the spec's id
  feature with `role: item`); none when the spec names no item.

Both are part of the training state (`state_dict` / `load_state_dict`), so a resumed run scores
them as an uninterrupted one would.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from slipstream.samples.spec import Spec
from trainers.data.rows import Features, Rows
from trainers.models.tables import table_sizes
from trainers.parallel.dist import Dist
from trainers.parallel.grad_exchange import SparseGradExchange, broadcast_dense, sparse_params

STATE_VERSION = 1
POPULARITY_PRIOR = 20.0
"""Pseudo-impressions at the global click rate added to every item (smooths rarely seen items)."""


class LogisticBaseline(nn.Module):
    dense_mean: torch.Tensor
    dense_std: torch.Tensor
    _sizes: torch.Tensor
    """Buffers (`register_buffer`), declared for the type checker."""

    def __init__(self, spec: Spec, buckets: dict[str, int] | None = None) -> None:
        super().__init__()
        sizes = table_sizes(spec, buckets)
        self.sparse_names = [f.name for f in spec.sparse]
        self.list_tables = [spec.table_of(f) for f in spec.lists]
        # sparse: ranks exchange the rows a batch touched, not the tables (Adagrad takes sparse gradients)
        tables = {name: nn.Embedding(n, 1, sparse=True) for name, n in sizes.items()}
        for emb in tables.values():
            nn.init.zeros_(emb.weight)
        self.weights = nn.ModuleDict(tables)
        n_dense = len(spec.dense)
        self.dense = nn.Linear(n_dense, 1) if n_dense else None
        self.bias = nn.Parameter(torch.zeros(1))
        self.register_buffer("dense_mean", torch.zeros(n_dense))
        self.register_buffer("dense_std", torch.ones(n_dense))
        self.register_buffer("_sizes", torch.tensor([sizes[n] for n in self.sparse_names], dtype=torch.int64),
                             persistent=False)

    def forward(self, x: Features) -> torch.Tensor:
        ids = torch.remainder(x.sparse, self._sizes)
        out = self.bias.expand(ids.shape[0]).clone()
        for j, name in enumerate(self.sparse_names):
            out = out + self.weights[name](ids[:, j]).squeeze(1)
        for table, values, offsets in zip(self.list_tables, x.list_values, x.list_offsets):
            w = self._table(table).weight
            out = out + F.embedding_bag(torch.remainder(values, w.shape[0]), w, offsets, mode="mean",
                                       sparse=True).squeeze(1)
        if self.dense is not None:
            out = out + self.dense((x.dense - self.dense_mean) / self.dense_std).squeeze(1)
        return out

    def _table(self, name: str) -> nn.Embedding:
        emb = self.weights[name]
        if not isinstance(emb, nn.Embedding):  # only Embeddings are put in `weights`
            raise TypeError(f"baseline table {name} is a {type(emb).__name__}, not an Embedding")
        return emb


class PopularityBaseline:
    """Per item bucket: impressions and clicks of the training rows; scores the smoothed rate."""

    def __init__(self, spec: Spec, buckets: dict[str, int] | None = None) -> None:
        item = spec.with_role("item")
        self.column = [f.name for f in spec.sparse].index(item.name) if item is not None else None
        self.size = table_sizes(spec, buckets)[item.name] if item is not None else 0
        self.views = np.zeros(self.size, dtype=np.float64)
        self.clicks = np.zeros(self.size, dtype=np.float64)

    @property
    def available(self) -> bool:
        return self.column is not None

    def add(self, rows: Rows) -> None:
        if self.column is None or not len(rows):
            return
        b = np.remainder(rows.sparse[:, self.column], self.size)
        self.views += np.bincount(b, minlength=self.size)
        self.clicks += np.bincount(b, weights=rows.label, minlength=self.size)

    def score(self, rows: Rows, views: np.ndarray, clicks: np.ndarray) -> np.ndarray:
        """Scores with the (all-ranks) counts `views` and `clicks`."""
        if self.column is None:
            return np.full(len(rows), np.nan)
        rate = clicks.sum() / max(views.sum(), 1.0)
        b = np.remainder(rows.sparse[:, self.column], self.size)
        scores: np.ndarray = (clicks[b] + POPULARITY_PRIOR * rate) / (views[b] + POPULARITY_PRIOR)
        return scores


class Baselines:
    """Both baselines of a run, stepped with the model's batches (every rank, every step)."""

    def __init__(self, spec: Spec, d: Dist, buckets: dict[str, int] | None, lr: float) -> None:
        self.d = d
        self.logistic = LogisticBaseline(spec, buckets).to(d.device)
        self.exchange: SparseGradExchange | None = None
        """Averages the gradients over ranks (its tables' touched rows and its few dense weights, no
        DDP); the model's stepper may take it over to run both in one exchange (`take_exchange`)."""
        if d.world > 1:
            tables = sparse_params(self.logistic)
            dense = {n: p for n, p in self.logistic.named_parameters() if n not in tables}
            broadcast_dense(list(dense.values()))  # rank 0's initial weights everywhere, as DDP would
            self.exchange = SparseGradExchange(tables, d.world, dense)
        self.opt = torch.optim.Adagrad(self.logistic.parameters(), lr=lr)
        self.popularity = PopularityBaseline(spec, buckets)
        self.count_popularity = True
        """Popularity counts the first epoch's rows and the stream's fresh rows: each row once."""

    def take_exchange(self) -> SparseGradExchange | None:
        """The exchange, for the caller to run (merged with its own) between `backward` and `apply`."""
        exchange, self.exchange = self.exchange, None
        return exchange

    def set_dense_stats(self, mean: torch.Tensor, std: torch.Tensor, standardized: torch.Tensor) -> None:
        dev = self.logistic.dense_mean.device  # the stats may come from the CPU, the model's flags from its device
        mean, std, standardized = mean.to(dev), std.to(dev), standardized.to(dev)
        std = torch.where(std > 1e-12, std, torch.ones_like(std))
        self.logistic.dense_mean.copy_(torch.where(standardized, mean, torch.zeros_like(mean)))
        self.logistic.dense_std.copy_(torch.where(standardized, std, torch.ones_like(std)))

    def backward(self, feats: Features, batch_size: int) -> None:
        """This rank's gradients of the batch (sum / batch size, as the model's; no collective).
        A step is `backward`, the exchange (`exchange`, or the stepper's that took it over), `apply`."""
        logits = self.logistic(feats)
        loss = F.binary_cross_entropy_with_logits(logits, feats.label, reduction="sum") / batch_size
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated

    def apply(self, rows: Rows, fresh: np.ndarray | None = None) -> None:
        """The Adagrad step on the exchanged gradients; popularity counts the rows (`fresh`: which
        rows are new: replayed rows train but are not counted again)."""
        self.opt.step()
        if self.count_popularity:
            self.popularity.add(rows if fresh is None else rows.mask(fresh))

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "logistic": self.logistic.state_dict(), "optimizer": self.opt.state_dict(),
                "views": torch.from_numpy(self.popularity.views), "clicks": torch.from_numpy(self.popularity.clicks),
                "count_popularity": self.count_popularity}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.logistic.load_state_dict(state["logistic"])
        self.opt.load_state_dict(state["optimizer"])
        self.popularity.views = state["views"].numpy().astype(np.float64)
        self.popularity.clicks = state["clicks"].numpy().astype(np.float64)
        self.count_popularity = bool(state["count_popularity"])

    def popularity_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Collective: the counts of every rank's rows."""
        if not self.popularity.available:
            return self.popularity.views, self.popularity.clicks
        both = self.d.gather((self.popularity.views, self.popularity.clicks))
        return sum(b[0] for b in both), sum(b[1] for b in both)
