"""Rows a managed table gives to a newly admitted id start afresh: the vector and first-order
weight of the shared "new id" row (row 0: what the model knew of the id until now) and zeroed
optimizer state (moments, accumulators), so nothing of the row's previous id carries over.

Whole tables (data parallel) are written through their parameters and the optimizer's state for
them. A sharded table is written shard by shard, by the rank holding each: column- and table-wise
shards hold row 0 beside every other row; a row-wise shard without row 0 starts its rows at zero.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainers.checkpoint.tensors import is_sharded


def _table_key(name: str, table: str) -> bool:
    return name.endswith(f"embedding_bags.{table}.weight")


@torch.no_grad()
def restart_whole(bags: list[nn.Module], optimizer_state: dict[Any, Any], table: str, rows: torch.Tensor) -> None:
    """Data parallel: `rows` of `table` in every collection of `bags` (vectors, first-order weights)."""
    for bag in bags:
        tables = getattr(bag, "embedding_bags", {})
        if table not in tables:
            continue
        w = tables[table].weight
        state = [v for v in optimizer_state.get(w, {}).values()
                 if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == w.shape[0]]
        if w.device.type == "cpu":  # numpy views: a tenth of the cost of torch's indexing on a few rows
            at = rows.numpy()
            wn = w.detach().numpy()
            wn[at] = wn[0]
            for v in state:
                v.numpy()[at] = 0
            continue
        w[rows] = w[0].clone()
        for v in state:
            v[rows] = 0


@torch.no_grad()
def restart_sharded(model_state: dict[str, Any], optimizer_state: dict[str, Any], table: str, rows: torch.Tensor) -> None:
    """Sharded: this rank's shards of `table` (`model_state`: the sharded module's state dict, whose
    local shards are views of the tables; `optimizer_state`: its optimizer's `state` by name)."""
    for name, value in model_state.items():
        if _table_key(name, table) and is_sharded(value):
            _write_shards(value, rows, copy_row0=True)
    for name, states in optimizer_state.items():
        if _table_key(name, table) and isinstance(states, dict):
            for value in states.values():
                if is_sharded(value):
                    _write_shards(value, rows, copy_row0=False)


def _write_shards(value: Any, rows: torch.Tensor, copy_row0: bool) -> None:
    for shard in value.local_shards():
        start, n = int(shard.metadata.shard_offsets[0]), int(shard.metadata.shard_sizes[0])
        t = shard.tensor
        mine = rows[(rows >= start) & (rows < start + n)].to(t.device) - start
        if mine.numel() == 0:
            continue
        if copy_row0 and start == 0:
            t[mine] = t[0].clone()
        else:
            t[mine] = 0
