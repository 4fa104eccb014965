"""The tables' sparse gradients summed over data-parallel ranks: only the rows a batch touched.

DDP would all-reduce a sparse gradient with gloo's sparse all-reduce, which corrupts the heap now
and then on torch 2.13 and 2.14 (a two-process loop of sparse DDP steps died with SIGSEGV or
"malloc(): unaligned tcache chunk" in about one run of three, empty batches or not). So the
tables stay out of DDP (which still averages the dense parameters) and their gradients travel
here with dense collectives: each rank's touched rows (ids and values, padded to a room every
rank agrees on) are all-gathered and added up, then divided by the world size as DDP does.
The model's dense parameters and a small model beside the tables (the logistic baseline) are
averaged whole in the same collectives, without a DDP of their own, and the step's control
numbers (each rank's row count, a wish to checkpoint) travel with them: a data-parallel step on
gloo makes one collective (two when its rows outgrow the room), not nine. A collective costs far
more than the bytes it carries here (0.3-2.7 ms each between two processes on this machine,
docs/benchmarks.md, Scale).
Dense models too large to gather cheaply (`DENSE_GATHER_MAX_BYTES`), and every model on GPUs,
keep DDP for their dense parameters (an all-reduce that overlaps the backward pass).
The bytes a rank sends are counted (`sent_bytes`) for `slipstream bench embeddings`.
"""

from __future__ import annotations

import itertools
import math

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


class TableGroup:
    """Tables whose rows are equally wide, as one id space (row r of table j is id `bases[j] + r`):
    their rows are deduplicated and summed with one `unique` and one `index_add_` for the whole
    group, not a sparse `coalesce` per table, which took a third of a rank's step on the 15 small
    tables of a model and its baseline (docs/benchmarks.md, Scale)."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.width = math.prod(params[0].shape[1:])
        self.offsets = [0, *itertools.accumulate(p.shape[0] for p in params)]
        """Where each table's rows start in the group's id space (and, last, where they end)."""
        self.bases = torch.tensor(self.offsets, dtype=torch.int64, device=params[0].device)
        """The same, as a tensor on the tables' device (searched with the exchanged ids there)."""

    def local_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's touched rows of every table in the group: (sorted unique ids, their summed values)."""
        ids, values = [], []
        for p, base in zip(self.params, self.offsets):
            g = p.grad
            if g is None:
                continue
            g = g if g.is_sparse else g.to_sparse(1)
            ids.append(g._indices()[0] + base)
            values.append(g._values().reshape(-1, self.width))
        if not ids:
            return self.bases.new_zeros(0), self.params[0].new_zeros((0, self.width))
        return _sum_rows(torch.cat(ids), torch.cat(values), self.offsets[-1])

    def set_grads(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Each table's gradient from the group's sorted unique `ids` and their `values`."""
        cuts = torch.searchsorted(ids, self.bases).tolist()
        for j, p in enumerate(self.params):
            a, b = cuts[j], cuts[j + 1]
            p.grad = torch.sparse_coo_tensor((ids[a:b] - self.offsets[j]).unsqueeze(0),
                                             values[a:b].reshape(-1, *p.shape[1:]).to(p.dtype), p.shape,
                                             is_coalesced=True, check_invariants=False)


MARK_MAX_SPACE_PER_ID = 8
"""`_sum_rows` marks the touched ids in an array as long as the id space (O(space), no sort)
while the space is at most this many times the ids; beyond, it sorts them (`torch.unique`).
Summing a rank's rows of the 25x day's tables (12k ids with repeats in a 45k-row space) took 0.25
ms marked against 0.65 ms sorted; a 1M-row space with as many ids, 2.1 ms against 0.6."""


def _sum_rows(ids: torch.Tensor, values: torch.Tensor, space: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with the same id (in [0, space)) added up: (sorted unique ids, their sums)."""
    if space <= MARK_MAX_SPACE_PER_ID * len(ids):
        below = ids.new_zeros(space + 1)
        below[ids + 1] = 1
        below.cumsum_(0)  # below[i]: how many touched ids are under i, the slot of id i
        slot = below[ids]
        unique = ids.new_empty(int(below[-1]))
        unique[slot] = ids
    else:
        unique, slot = torch.unique(ids, sorted=True, return_inverse=True)
    return unique, values.new_zeros((len(unique), values.shape[1])).index_add_(0, slot, values)


def table_groups(params: list[nn.Parameter]) -> list[TableGroup]:
    """`params` grouped by row width and dtype, in order of first appearance."""
    by: dict[tuple[tuple[int, ...], torch.dtype], list[nn.Parameter]] = {}
    for p in params:
        by.setdefault((tuple(p.shape[1:]), p.dtype), []).append(p)
    return [TableGroup(ps) for ps in by.values()]


class SparseGradExchange:
    """`params`: tables whose gradients are sparse (each rank's touched rows travel); `dense`:
    parameters averaged whole, as DDP would (a small model beside the tables: the logistic
    baseline), in the same collective instead of a DDP all-reduce of their own."""

    def __init__(self, params: dict[str, nn.Parameter], world: int,
                 dense: dict[str, nn.Parameter] | None = None) -> None:
        self.params = list(params.values())
        self.dense = list((dense or {}).values())
        self.world = world
        self.groups = table_groups(self.params)
        self.device = _device(self.params + self.dense)
        """Where the parameters live, and so what the collectives move (NCCL takes CUDA tensors only)."""
        self.sent_bytes = 0
        """Bytes this rank handed to the collectives since construction (ids, values and counts)."""
        self.gathers = 0
        """All-gathers since construction: one a step, two when a step's rows outgrow the room."""
        self.room = (0, 0)
        """(ids, values) a rank's part of the next all-gather has room for; the same on every rank."""

    def merged(self, other: "SparseGradExchange") -> "SparseGradExchange":
        """One exchange for both sets of parameters (the model's and the baseline's tables in the
        same collective)."""
        out = SparseGradExchange({}, self.world)
        out.params, out.dense = self.params + other.params, self.dense + other.dense
        out.groups = table_groups(out.params)
        out.device = _device(out.params + out.dense)
        return out

    def __call__(self, control: list[int] | None = None) -> list[int]:
        """Collective: replace each table's local gradient by the sum over ranks / world size, and
        each dense parameter's by its mean, in one all-gather per step whatever the number of
        tables: each rank's row counts and `control`, then its ids and values, end to end as bytes,
        padded to a room every rank agrees on (the largest need of the step before, plus a
        quarter). A step whose rows do not fit one rank's room takes a second all-gather at the
        exact size. On gloo a collective costs 1-2 ms on a loaded 2-core machine
        (docs/benchmarks.md, Scale), more than the rows it carries.

        `control`: small integers of this rank (its row count first) summed over ranks and
        returned. When no rank has a row (the sum's first number is 0) the gradients are left as
        they are, by every rank alike."""
        control = list(control or [])
        if self.world <= 1:
            return control
        rows = [g.local_rows() for g in self.groups]
        dense = [p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in self.dense]
        dtype = (self.params + self.dense)[0].dtype if self.params or self.dense else torch.float32
        n, widths = len(self.groups), [g.width for g in self.groups]
        n_dense = sum(len(x) for x in dense)
        ids = torch.cat([i for i, _ in rows]) if rows else torch.zeros(0, dtype=torch.int64, device=self.device)
        values = [*dense, *(v.reshape(-1) for _, v in rows)]
        flat = torch.cat(values).to(dtype) if values else torch.zeros(0, dtype=dtype, device=self.device)
        head = torch.tensor([len(i) for i, _ in rows] + control, dtype=torch.int64, device=self.device)
        id_room, value_room = self.room
        start = head.numel() * 8  # where a rank's ids begin in its part
        chunks = self._gather(_pack(head, ids, id_room, flat, n_dense + value_room))
        heads = torch.stack([c[:start].view(torch.int64) for c in chunks]).tolist()
        totals = [sum(h[n + k] for h in heads) for k in range(len(control))]
        if control and totals[0] == 0:
            return totals
        all_counts = [h[:n] for h in heads]  # rows per group, of each rank
        value_counts = [[k * w for k, w in zip(c, widths)] for c in all_counts]
        need = (max(sum(c) for c in all_counts), max(sum(v) for v in value_counts))
        if need[0] > id_room or need[1] > value_room:
            id_room, value_room = need
            chunks = self._gather(_pack(head, ids, id_room, flat, n_dense + value_room))
        self.room = (math.ceil(need[0] * ROOM_HEADROOM), math.ceil(need[1] * ROOM_HEADROOM))
        cut = start + max(id_room, 1) * 8  # where its values begin (ids padded to one at least)
        per_ids: list[list[torch.Tensor]] = [[] for _ in self.groups]
        per_values: list[list[torch.Tensor]] = [[] for _ in self.groups]
        dense_sum = torch.zeros(n_dense, dtype=dtype, device=self.device)
        for c, v, chunk in zip(all_counts, value_counts, chunks):
            flat_ids = chunk[start:cut].view(torch.int64)
            flat_values = chunk[cut:].view(dtype)
            dense_sum += flat_values[:n_dense]
            flat_values = flat_values[n_dense:]
            for j, (a, b) in enumerate(zip(flat_ids[:sum(c)].split(c), flat_values[:sum(v)].split(v))):
                per_ids[j].append(a)
                per_values[j].append(b.reshape(-1, widths[j]))
        for j, g in enumerate(self.groups):
            summed_ids, summed = _sum_rows(torch.cat(per_ids[j]), torch.cat(per_values[j]), g.offsets[-1])
            g.set_grads(summed_ids, summed / self.world)
        for p, d in zip(self.dense, (dense_sum / self.world).split([p.numel() for p in self.dense])):
            p.grad = d.reshape(p.shape).to(p.dtype)
        return totals

    def _gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """All ranks' `t` (every rank's is as long)."""
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t)
        self.sent_bytes += t.numel() * t.element_size()
        self.gathers += 1
        return out


def _device(params: list[nn.Parameter]) -> torch.device:
    """The parameters' device (the first one's: a model's parameters share one); CPU for none."""
    return params[0].device if params else torch.device("cpu")


ROOM_HEADROOM = 1.25
"""The next step's room: this step's largest need times this (steps of one batch size vary little)."""


def _pack(head: torch.Tensor, ids: torch.Tensor, id_room: int, values: torch.Tensor, value_room: int) -> torch.Tensor:
    """One rank's part of the all-gather, as bytes, as long on every rank: its counts, its ids in
    `id_room` slots, its values in `value_room` (zeros after them; cut when they do not fit, and
    then every rank sees from the counts that a second all-gather at the exact size follows)."""
    return torch.cat([_bytes(head), _bytes(_padded(ids[:id_room], id_room)), _bytes(_padded(values[:value_room], value_room))])


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
