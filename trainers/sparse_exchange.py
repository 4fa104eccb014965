"""The tables' sparse gradients summed over data-parallel ranks: only the rows a batch touched.

DDP would all-reduce a sparse gradient with gloo's sparse all-reduce, which corrupts the heap now
and then on torch 2.13 and 2.14 (a two-process loop of sparse DDP steps died with SIGSEGV or
"malloc(): unaligned tcache chunk" in about one run of three, empty batches or not). So the
tables stay out of DDP (which still averages the dense parameters) and their gradients travel
here with dense collectives: each rank's touched rows (ids and values, padded to the largest
count of any rank) are all-gathered and added up, then divided by the world size as DDP does.
The model's dense parameters and a small model beside the tables (the logistic baseline) are
averaged whole in the same collectives, without a DDP of their own, and the step's control
numbers (each rank's row count, a wish to checkpoint) travel with the first one: a data-parallel
step on gloo makes two collectives, not nine. A collective costs far more than the bytes it
carries here (0.3-2.7 ms each between two processes on this machine, docs/benchmarks.md, Scale).
Dense models too large to gather cheaply (`DENSE_GATHER_MAX_BYTES`), and every model on GPUs,
keep DDP for their dense parameters (an all-reduce that overlaps the backward pass).
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


DENSE_GATHER_MAX_BYTES = 8 << 20
"""Dense gradients are all-gathered (world x their bytes to every rank) up to this many bytes in
all; larger dense parts are averaged by DDP's all-reduce."""


def data_parallel(model: nn.Module, world: int, device: torch.device) -> tuple[nn.Module, "SparseGradExchange | None"]:
    """The module to run forward (`model`, or `model` under DDP for its dense parameters) and the
    exchange its gradients need after each backward (None for one process: nothing to exchange).
    On CPU a dense part small enough to gather travels in the exchange too: one collective a step
    fewer than DDP's."""
    if world <= 1:
        return model, None
    tables = sparse_params(model)
    dense = {n: p for n, p in model.named_parameters() if p.requires_grad and n not in tables}
    dense_bytes = sum(p.numel() * p.element_size() for p in dense.values())
    if device.type == "cpu" and dense_bytes * world <= DENSE_GATHER_MAX_BYTES:
        broadcast_dense(list(dense.values()))  # rank 0's initial weights everywhere, as DDP would
        return model, SparseGradExchange(tables, world, dense)
    from torch.nn.parallel import DistributedDataParallel as DDP

    DDP._set_params_and_buffers_to_ignore_for_model(model, list(tables))
    # buffers (the dense features' statistics, table sizes) are set alike on every rank before the
    # first step and never change: no broadcast of them before every forward (a collective a step)
    net = DDP(model, device_ids=[device] if device.type == "cuda" else None, broadcast_buffers=False)
    return net, SparseGradExchange(tables, world)


class SparseGradExchange:
    """`params`: tables whose gradients are sparse (each rank's touched rows travel); `dense`:
    parameters averaged whole, as DDP would (a small model beside the tables: the logistic
    baseline), in the same two collectives instead of a DDP all-reduce of their own."""

    def __init__(self, params: dict[str, nn.Parameter], world: int,
                 dense: dict[str, nn.Parameter] | None = None) -> None:
        self.params = list(params.values())
        self.dense = list((dense or {}).values())
        self.world = world
        self.sent_bytes = 0
        """Bytes this rank handed to the collectives since construction (ids, values and counts)."""

    def merged(self, other: "SparseGradExchange") -> "SparseGradExchange":
        """One exchange for both sets of parameters (the model's and the baseline's tables in the
        same two collectives)."""
        out = SparseGradExchange({}, self.world)
        out.params, out.dense = self.params + other.params, self.dense + other.dense
        return out

    def __call__(self, control: list[int] | None = None) -> list[int]:
        """Collective: replace each table's local gradient by the sum over ranks / world size, and
        each dense parameter's by its mean. Two all-gathers per step whatever the number of tables
        (the counts; then ids and values end to end, as bytes): on gloo a collective costs 1-2 ms
        on a loaded 2-core machine (docs/benchmarks.md, Scale), more than the rows it carries.

        `control`: small integers of this rank (its row count first) summed over ranks in the first
        all-gather and returned. When no rank has a row (the sum's first number is 0) the
        gradients are left as they are and the second all-gather is skipped, by every rank alike."""
        control = list(control or [])
        if self.world <= 1:
            return control
        grads = [self._local(p) for p in self.params]
        ids = [g.indices()[0] for g in grads]
        values = [g.values().reshape(-1) for g in grads]
        dense = [p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in self.dense]
        dtype = (values + dense)[0].dtype if values or dense else torch.float32
        n = len(self.params)
        counts = torch.tensor([len(i) for i in ids] + [len(v) for v in values] + control, dtype=torch.int64)
        gathered = self._gather(counts)
        totals = [int(x) for x in torch.stack(gathered)[:, 2 * n:].sum(0)] if control else []
        if control and totals[0] == 0:
            return totals
        all_counts = [c[:2 * n] for c in gathered]
        id_room = max(int(c[:n].sum()) for c in all_counts)
        value_room = max(int(c[n:].sum()) for c in all_counts)
        n_dense = sum(len(x) for x in dense)
        payload = torch.cat([_bytes(_padded(torch.cat(ids) if ids else torch.zeros(0, dtype=torch.int64), id_room)),
                             _bytes(_padded(torch.cat([*dense, *values]).to(dtype) if values or dense
                                            else torch.zeros(0, dtype=dtype), n_dense + value_room))])
        cut = max(id_room, 1) * 8  # (padded to one id at least)
        per_ids: list[list[torch.Tensor]] = [[] for _ in self.params]
        per_values: list[list[torch.Tensor]] = [[] for _ in self.params]
        dense_sum = torch.zeros(n_dense, dtype=dtype)
        for c, chunk in zip(all_counts, self._gather(payload)):
            flat_ids = chunk[:cut].view(torch.int64)
            flat_values = chunk[cut:].view(dtype)
            dense_sum += flat_values[:n_dense]
            flat_values = flat_values[n_dense:]
            for j, (a, b) in enumerate(zip(flat_ids[:int(c[:n].sum())].split(c[:n].tolist()),
                                           flat_values[:int(c[n:].sum())].split(c[n:].tolist()))):
                per_ids[j].append(a)
                per_values[j].append(b)
        for j, p in enumerate(self.params):
            rows = torch.cat(per_values[j]).reshape(-1, *p.shape[1:]).to(p.dtype) / self.world
            p.grad = torch.sparse_coo_tensor(torch.cat(per_ids[j]).unsqueeze(0), rows, p.shape).coalesce()
        for p, g in zip(self.dense, (dense_sum / self.world).split([p.numel() for p in self.dense])):
            p.grad = g.reshape(p.shape).to(p.dtype)
        return totals

    def _gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """All ranks' `t` (every rank's is as long)."""
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


def _padded(t: torch.Tensor, size: int) -> torch.Tensor:
    """`t` with zeros up to `size` elements (at least one: no zero-length collectives)."""
    size = max(size, 1)
    return torch.cat([t, t.new_zeros(size - len(t))]) if size > len(t) else t


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def broadcast_dense(params: list[nn.Parameter]) -> None:
    """Collective: every rank takes rank 0's values of `params` (what DDP does at construction),
    in one broadcast."""
    if not params:
        return
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    dist.broadcast(flat, src=0)
    with torch.no_grad():
        for p, v in zip(params, flat.split([p.numel() for p in params])):
            p.copy_(v.reshape(p.shape))
