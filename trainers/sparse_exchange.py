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
        """Collective: replace each table's local gradient by the sum over ranks / world size.
        Three all-gathers per step whatever the number of tables (counts, ids, values: every
        table's rows end to end), as a step's latency is the round trips on small batches."""
        if self.world <= 1:
            return
        grads = [self._local(p) for p in self.params]
        ids = [g.indices()[0] for g in grads]
        values = [g.values().reshape(-1) for g in grads]
        counts = torch.tensor([len(i) for i in ids] + [len(v) for v in values], dtype=torch.int64)
        all_counts = self._gather(counts)
        n = len(self.params)
        all_ids = self._gather(torch.cat(ids), max(int(c[:n].sum()) for c in all_counts))
        all_values = self._gather(torch.cat(values), max(int(c[n:].sum()) for c in all_counts))
        per_ids: list[list[torch.Tensor]] = [[] for _ in self.params]
        per_values: list[list[torch.Tensor]] = [[] for _ in self.params]
        for c, flat_ids, flat_values in zip(all_counts, all_ids, all_values):
            for j, (a, b) in enumerate(zip(flat_ids[:int(c[:n].sum())].split(c[:n].tolist()),
                                           flat_values[:int(c[n:].sum())].split(c[n:].tolist()))):
                per_ids[j].append(a)
                per_values[j].append(b)
        for j, p in enumerate(self.params):
            rows = torch.cat(per_values[j]).reshape(-1, *p.shape[1:]) / self.world
            p.grad = torch.sparse_coo_tensor(torch.cat(per_ids[j]).unsqueeze(0), rows, p.shape).coalesce()

    def _gather(self, t: torch.Tensor, size: int | None = None) -> list[torch.Tensor]:
        """All ranks' `t`, each padded to `size` elements (every rank's tensor must be as long)."""
        size = max(size, 1) if size is not None else None  # no zero-length collectives
        if size is not None and size > len(t):
            t = torch.cat([t, t.new_zeros(size - len(t))])
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t)
        self.sent_bytes += t.numel() * t.element_size()
        return out

    @staticmethod
    def _local(p: nn.Parameter) -> torch.Tensor:
        if p.grad is None:
            return torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64, device=p.device),
                                           torch.zeros((0, *p.shape[1:]), dtype=p.dtype, device=p.device), p.shape)
        g = p.grad if p.grad.is_sparse else p.grad.to_sparse(1)
        return g.coalesce()
