"""The tables' sparse gradients summed over data-parallel ranks: only the rows a batch touched.

DDP would all-reduce a sparse gradient with gloo's sparse all-reduce, which corrupts the heap now
and then on torch 2.13 and 2.14 (a two-process loop of sparse DDP steps died with SIGSEGV or
"malloc(): unaligned tcache chunk" in about one run of three, empty batches or not). So the
tables stay out of DDP (which still averages the dense parameters) and their gradients travel
here with dense collectives: each rank's touched rows (ids and values, padded to the largest
count of any rank) are all-gathered and added up, then divided by the world size as DDP does.
The bytes a rank sends are counted (`sent_bytes`) for `slipstream bench embeddings`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def sparse_params(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters whose gradients are sparse (embedding tables built with `sparse=True`), by name."""
    out = {}
    for prefix, m in model.named_modules():
        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse and m.weight.requires_grad:
            out[f"{prefix}.weight" if prefix else "weight"] = m.weight
    return out


def data_parallel(model: nn.Module, world: int, device: torch.device) -> tuple[nn.Module, "SparseGradExchange | None"]:
    """`model` under DDP for its dense parameters, and the exchange its sparse ones need after each
    backward (None for one process: the model itself, nothing to exchange)."""
    if world <= 1:
        return model, None
    from torch.nn.parallel import DistributedDataParallel as DDP

    tables = sparse_params(model)
    DDP._set_params_and_buffers_to_ignore_for_model(model, list(tables))
    net = DDP(model, device_ids=[device] if device.type == "cuda" else None)
    return net, SparseGradExchange(tables, world)


class SparseGradExchange:
    def __init__(self, params: dict[str, nn.Parameter], world: int) -> None:
        self.params = list(params.values())
        self.world = world
        self.sent_bytes = 0
        """Bytes this rank handed to the collectives since construction (ids, values and counts)."""

    def __call__(self) -> None:
        """Collective: replace each table's local gradient by the sum over ranks / world size."""
        if self.world <= 1:
            return
        grads = [self._local(p) for p in self.params]
        counts = torch.tensor([g.indices().shape[1] for g in grads], dtype=torch.int64)
        all_counts = [torch.empty_like(counts) for _ in range(self.world)]
        dist.all_gather(all_counts, counts)
        self.sent_bytes += counts.numel() * 8
        for j, (p, g) in enumerate(zip(self.params, grads)):
            p.grad = self._summed(p, g, [int(c[j]) for c in all_counts])

    @staticmethod
    def _local(p: nn.Parameter) -> torch.Tensor:
        if p.grad is None:
            return torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64, device=p.device),
                                           torch.zeros((0, *p.shape[1:]), dtype=p.dtype, device=p.device), p.shape)
        g = p.grad if p.grad.is_sparse else p.grad.to_sparse(1)
        return g.coalesce()

    def _summed(self, p: nn.Parameter, g: torch.Tensor, counts: list[int]) -> torch.Tensor:
        top = max(counts)
        ids, values = g.indices()[0], g.values()
        pad = top - ids.shape[0]
        if pad:
            ids = torch.cat([ids, ids.new_zeros(pad)])
            values = torch.cat([values, values.new_zeros((pad, *values.shape[1:]))])
        all_ids = [torch.empty_like(ids) for _ in range(self.world)]
        all_values = [torch.empty_like(values) for _ in range(self.world)]
        dist.all_gather(all_ids, ids)
        dist.all_gather(all_values, values)
        self.sent_bytes += ids.numel() * ids.element_size() + values.numel() * values.element_size()
        ids = torch.cat([a[:n] for a, n in zip(all_ids, counts)])
        values = torch.cat([v[:n] for v, n in zip(all_values, counts)]) / self.world
        return torch.sparse_coo_tensor(ids.unsqueeze(0), values, p.shape).coalesce()
