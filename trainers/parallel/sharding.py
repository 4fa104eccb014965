"""Embedding tables sharded over ranks: TorchRec's `DistributedModelParallel` (`model.sharding`).

With `model.sharding` other than `none`, every table of the model (`RecModel.tables`: the vectors
and the first-order weights) is placed by TorchRec's planner: `auto` lets it choose among the
sharding types the device has kernels for, a named type forces it. A rank then holds only its
shards; a batch's ids travel to the ranks owning their rows and the pooled vectors come back
(all-to-all), and the tables are stepped inside the backward pass by FBGEMM's fused optimizer
(`optim.table_optimizer`: `adagrad`; `sparse_adam` as fused Adam on GPUs). The dense part (MLPs,
wide part) is data parallel (DDP), stepped by `optim.name`.

What runs where (fbgemm-gpu-cpu 1.9 / fbgemm-gpu 1.9, measured on CPU; docs/models.md):

| device | sharding types | fused table optimizers |
|---|---|---|
| CPU (gloo) | table_wise, column_wise | adagrad |
| CUDA (NCCL) | table_wise, column_wise, row_wise, table_row_wise | adagrad, sparse_adam |

A sharded run uses the sharded model at every world size, one process included (a process group
of one), so a run checkpointed at two processes resumes at one with the same optimizer.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from slipstream.errors import ConfigError
from trainers.config.schema import ModelConfig
from trainers.parallel.dist import Dist
from trainers.models.tables import MIN_SHARDED_DIM
from trainers.checkpoint.tensors import is_sharded

log = logging.getLogger(__name__)

SHARDING_TYPES = ("table_wise", "column_wise", "row_wise", "table_row_wise")
DEVICE_TYPES = {"cpu": ("table_wise", "column_wise"), "cuda": SHARDING_TYPES}
"""Sharding types with a fused kernel on each device."""
DEVICE_OPTIMIZERS = {"cpu": ("adagrad",), "cuda": ("adagrad", "sparse_adam")}


def check_sharding(model_cfg: ModelConfig, tables: str, device: torch.device) -> list[str]:
    """The sharding types the planner may use with `tables` (`optim.table_optimizer`); a clear
    error for what the device cannot run."""
    sharding = model_cfg.sharding
    allowed = DEVICE_TYPES[device.type]
    if tables not in DEVICE_OPTIMIZERS[device.type]:
        raise ConfigError(
            f"model.sharding={sharding} steps the tables with FBGEMM's fused optimizers, which on {device.type} "
            f"support optim.table_optimizer={' or '.join(DEVICE_OPTIMIZERS[device.type])}, got {tables!r}; "
            "or set model.sharding=none (data parallel, sparse gradients)")
    if model_cfg.embed_dim % MIN_SHARDED_DIM:
        raise ConfigError(f"model.sharding={sharding} needs model.embed_dim divisible by {MIN_SHARDED_DIM} "
                          f"(FBGEMM's kernels), got {model_cfg.embed_dim}")
    if sharding == "auto":
        return list(allowed)
    if sharding not in allowed:
        raise ConfigError(f"model.sharding={sharding} has no kernel on {device.type} "
                          f"(there: {', '.join(allowed)}); use one of those, auto, or none")
    return [sharding]


def ensure_group(d: Dist) -> None:
    """A sharded model needs a process group, also for one process (torchrun with one process, or
    a plain `python -m trainers.train`)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def shard_model(model: nn.Module, model_cfg: ModelConfig, tables: str, lr: float, d: Dist) -> nn.Module:
    """`model` with its tables sharded (DistributedModelParallel) and stepped in backward by the
    fused `tables` optimizer at `lr`; collective."""
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    types = check_sharding(model_cfg, tables, d.device)
    ensure_group(d)
    spec_tables = model.tables  # type: ignore[attr-defined]
    optimizer = torch.optim.Adagrad if tables == "adagrad" else torch.optim.Adam
    apply_optimizer_in_backward(optimizer, spec_tables.parameters(), {"lr": lr})
    names = {c.name for bag in spec_tables.bags() for c in bag.embedding_bag_configs()}
    world = dist.get_world_size()
    # column-wise: one shard per rank (the planner's default shard width would keep a narrow table whole)
    width = max(MIN_SHARDED_DIM, model_cfg.embed_dim // world // MIN_SHARDED_DIM * MIN_SHARDED_DIM)
    constraints = {n: ParameterConstraints(sharding_types=types, compute_kernels=[EmbeddingComputeKernel.FUSED.value],
                                           min_partition=width)
                   for n in names}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device=d.device.type),
                                       constraints=constraints)
    sharders: list[Any] = [EmbeddingBagCollectionSharder()]
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    sharded = DistributedModelParallel(model, device=d.device, plan=plan, sharders=sharders)
    if d.is_main:
        log.info("tables sharded over %d rank(s): %s", world, describe(plan))
    return sharded


def describe(plan: Any) -> dict[str, str]:
    """{table: "<sharding type> on ranks [..]"} of a sharding plan."""
    out = {}
    for module, params in plan.plan.items():
        for name, p in params.items():
            ranks = sorted({r for r in (p.ranks or [])})
            out[f"{module}.{name}" if module else name] = f"{p.sharding_type} on ranks {ranks}"
    return out


def gather_state(model: nn.Module, rank: int) -> dict[str, torch.Tensor] | None:
    """Collective: the model's state with every sharded table whole, on rank 0 (None elsewhere)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if is_sharded(value):
            whole = torch.empty(value.size(), dtype=value.dtype) if rank == 0 else None
            value.gather(dst=0, out=whole)
            if whole is not None:
                out[key] = whole
        else:
            out[key] = value.detach().cpu()
    return out if rank == 0 else None


def local_tensors(state: Any) -> list[torch.Tensor]:
    """Every tensor of a state tree that lives on this rank, in a fixed order (a sharded table:
    its local shards), for a copy kept in memory or on disk per rank."""
    if is_sharded(state):
        return [s.tensor for s in state.local_shards()]
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for k in sorted(state, key=str) for t in local_tensors(state[k])]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in local_tensors(v)]
    return []
