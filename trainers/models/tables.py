"""The spec's embedding tables as TorchRec modules, and the model's sparse input as a
`KeyedJaggedTensor`.

Every id, categorical, list and sequence feature is one key of the jagged tensor: a single-valued
feature is a bag of one value per row, a list a bag of its values (variable length, no padding).
Each table is an `EmbeddingBagConfig` sized by the spec (`buckets`, or `model.buckets` where it
names the feature); a list that `shares` an id's table is one more feature of that table, so a
history item and the same item as a candidate look up one row. Tables pool by mean: a one-value bag
is that row, an empty history is zeros.

The tables' gradients are sparse (the rows a batch touched): see `trainers.step` for how they
travel between ranks and which optimizer applies them.

Ids of a hashed table are taken modulo its rows here, per feature in one tensor op, so ids from
any id space fit whatever size the spec gives a table. Ids of a managed table (`table: managed`)
are looked up in its id -> row map (`trainers.models.managed`), which is part of the model: a
scored or exported model maps ids exactly as training did.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, PoolingType

from slipstream.samples.spec import Spec
from trainers.data.rows import Features
from trainers.models.managed import ManagedIds

MIN_SHARDED_DIM = 4
"""FBGEMM's kernels need a sharded table's width (each column shard's) divisible by 4."""


def table_sizes(spec: Spec, overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """Rows of each embedding table: the spec's `buckets` (a managed table's `rows`), or
    `model.buckets` where it names the feature (an experiment, a benchmark with a large table).
    Lists that share a table have none."""
    sizes = {}
    for f in spec.features:
        if f.is_sparse or (f.is_list and f.shares is None):
            sizes[f.name] = int((overrides or {}).get(f.name) or f.table_rows or 1)
    return sizes


def sparse_kjt(x: Features, keys: list[str], sizes: torch.Tensor, managed: ManagedIds | None = None) -> KeyedJaggedTensor:
    """The rows' sparse features as one jagged tensor, key by key (`keys`: the single-valued
    features, then the lists, as `RowLayout` orders them), each id modulo its table's rows
    (`sizes`, one per key), or its row in the map of a `managed` table. A handful of tensor ops
    per batch, none per row."""
    n = x.sparse.shape[0]
    k = x.sparse.shape[1]
    rows = torch.remainder(x.sparse, sizes[:k])
    for j, key in enumerate(keys[:k]):
        if managed and key in managed.table_of:
            rows[:, j] = managed.map(managed.table_of[key]).lookup(x.sparse[:, j])
    values = [rows.t().reshape(-1)]
    lengths = [torch.ones(n * k, dtype=torch.int64, device=x.sparse.device)]
    for j, (v, starts) in enumerate(zip(x.list_values, x.list_offsets)):
        key = keys[k + j]
        if managed and key in managed.table_of:
            values.append(managed.map(managed.table_of[key]).lookup(v))
        else:
            values.append(torch.remainder(v, sizes[k + j]))
        ends = torch.cat([starts[1:], torch.tensor([v.shape[0]], dtype=starts.dtype, device=starts.device)])
        lengths.append(ends - starts)
    return KeyedJaggedTensor(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths), stride=n)


class SpecTables(nn.Module):
    """The spec's tables (`vectors`: `embed_dim` wide, one per table) and, with `first_order`, a
    `bias_dim`-wide table per single-valued feature (`biases`: the FM/wide model's per-id weight,
    the sum of its row: 1 wide, or 4 where FBGEMM's sharded kernels need 4 columns at least)."""

    def __init__(self, spec: Spec, embed_dim: int, buckets: Mapping[str, int] | None = None,
                 first_order: bool = False, bias_dim: int = 1) -> None:
        super().__init__()
        self.sizes = table_sizes(spec, buckets)
        self.sparse_names = [f.name for f in spec.sparse]
        self.list_names = [f.name for f in spec.lists]
        self.keys = self.sparse_names + self.list_names
        self.id_tables = {spec.table_of(f) for f in spec.features if f.kind == "id"}
        table_of = {f.name: spec.table_of(f) for f in (*spec.sparse, *spec.lists)}
        configs = [EmbeddingBagConfig(name=t, embedding_dim=embed_dim, num_embeddings=n, pooling=PoolingType.MEAN,
                                      feature_names=[k for k in self.keys if table_of[k] == t])
                   for t, n in self.sizes.items()]
        self.vectors = EmbeddingBagCollection(tables=configs)
        self.biases = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=f, embedding_dim=bias_dim, num_embeddings=self.sizes[f], feature_names=[f])
            for f in self.sparse_names]) if first_order and self.sparse_names else None
        # Sparse gradients: a step's table gradient is the rows the batch touched, so data-parallel
        # ranks exchange those rows (DDP's sparse all-reduce), never whole tables.
        for bag in self.modules():
            if isinstance(bag, nn.EmbeddingBag):
                bag.sparse = True
        self.register_buffer("_key_sizes", torch.tensor([self.sizes[table_of[k]] for k in self.keys], dtype=torch.int64),
                             persistent=False)
        self.managed = ManagedIds(spec, self.sizes)
        """The id -> row maps of the managed tables (buffers: saved and exported with the weights)."""
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Small vectors: dot products of N(0, 1) vectors would start the interactions saturated.
        for p in self.vectors.parameters():
            nn.init.normal_(p, std=0.05)
        for p in (self.biases.parameters() if self.biases is not None else ()):
            nn.init.zeros_(p)

    def bags(self) -> list[EmbeddingBagCollection]:
        """The collections of tables (vectors, and first-order weights when the model has them)."""
        return [self.vectors] + ([self.biases] if self.biases is not None else [])

    def kjt(self, x: Features) -> KeyedJaggedTensor:
        return sparse_kjt(x, self.keys, self._key_sizes, self.managed)

    def table_ids(self, sparse: np.ndarray) -> dict[str, np.ndarray]:
        """Each managed table's ids in these rows (`Rows.sparse`): its own feature's values, the
        occurrences the step observes before the forward. (Lists and sequences that share the
        table look its map up but add no occurrences: a history repeats earlier events.)"""
        return {t: sparse[:, self.sparse_names.index(t)] for t in self.managed.maps}

    def forward(self, kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        """Each feature's pooled vector, (n, embed_dim), by feature name."""
        return self.vectors(kjt).to_dict()

    def first_order(self, kjt: KeyedJaggedTensor) -> torch.Tensor | None:
        """(n,) sum of the single-valued features' per-id weights, or None without them."""
        if self.biases is None:
            return None
        return self.biases(kjt).values().sum(dim=1)
