"""Optimizer groups and learning rates of the trainer's models (`trainers.models`).

The per-id tables (user, item and their first-order weights) and everything shared by all samples
(MLPs, wide part, categorical tables) are two named groups, so a phase can give them different
rates and the ids their own L2.
"""

from __future__ import annotations

from typing import Any

from torch import nn

import torch

from trainers.models import RecModel


def is_id_param(model: RecModel, name: str) -> bool:
    """Per-id parameters: the tables (vectors and first-order weights) of id features, each row
    trained only by its own samples (a user's, an item's). Everything else is shared by all samples.
    TorchRec names a table's weight `...embedding_bags.<table>.weight`."""
    parts = name.split(".")
    return len(parts) >= 3 and parts[-3] == "embedding_bags" and parts[-2] in model.tables.id_tables


def param_groups(model: RecModel, id_weight_decay: float | None = None) -> list[dict[str, object]]:
    """Two optimizer groups, named so a phase can give them different learning rates: the per-id
    tables (`ids`) and everything shared by all samples (`shared`: MLPs, wide part, categoricals).
    `id_weight_decay` (None: the optimizer's `weight_decay`) is the ids group's own L2."""
    ids = [p for n, p in model.named_parameters() if is_id_param(model, n) and p.requires_grad]
    shared = [p for n, p in model.named_parameters() if not is_id_param(model, n) and p.requires_grad]
    id_group: dict[str, object] = {"params": ids, "name": "ids"}
    if id_weight_decay is not None:
        id_group["weight_decay"] = id_weight_decay
    return [id_group, {"params": shared, "name": "shared"}]


TABLE_OPTIMIZERS = ("dense", "sparse_adam", "adagrad")


def is_table_param(name: str) -> bool:
    return ".embedding_bags." in name


class Optimizers:
    """Several optimizers stepped as one (the tables' sparse one and the dense parts'): the union
    of their named groups, one state dict."""

    def __init__(self, *opts: torch.optim.Optimizer) -> None:
        self.opts = opts

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.opts for g in o.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        return {k: v for o in self.opts for k, v in o.state.items()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for o in self.opts:
            o.step()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [o.state_dict() for o in self.opts]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for o, s in zip(self.opts, state["optimizers"], strict=True):
            o.load_state_dict(s)


def build_optimizer(model: RecModel, name: str, lr: float, weight_decay: float,
                    id_weight_decay: float | None = None, tables: str = "dense") -> "torch.optim.Optimizer | Optimizers":
    """`id_weight_decay` is the L2 of the per-id tables (None: `weight_decay`). With Adam (coupled)
    it is a Gaussian prior on every user's and item's vectors and bias, applied to all rows each
    step as the mean loss's penalty would be: an id seen a few times stays near 0, a frequent one
    is set by its data (measured: docs/benchmarks.md, Model quality).

    `tables` (`optim.table_optimizer`): `dense` steps the tables with `name` too, on their sparse
    gradients made dense on each rank after the exchange (every row, so the L2 prior reaches ids
    a batch did not touch; memory and time grow with the tables). `sparse_adam` (lazy Adam) or
    `adagrad` step only the rows a batch touched, without weight decay: for tables of millions of
    rows."""
    if tables == "dense":
        opt = dense_optimizer(name, param_groups(model, id_weight_decay), lr, weight_decay)
        params = [p for g in opt.param_groups for p in g["params"]]
        opt.register_step_pre_hook(lambda *_: densify_grads(params))
        return opt
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    table_groups = [{"params": [p for n, p in named if is_table_param(n) and is_id_param(model, n)], "name": "ids", "tables": True},
                    {"params": [p for n, p in named if is_table_param(n) and not is_id_param(model, n)], "name": "shared",
                     "tables": True}]
    dense = [{"params": [p for n, p in named if not is_table_param(n)], "name": "shared"}]
    sparse: torch.optim.Optimizer = (torch.optim.SparseAdam(table_groups, lr=lr) if tables == "sparse_adam"
                                     else torch.optim.Adagrad(table_groups, lr=lr))
    return Optimizers(sparse, dense_optimizer(name, dense, lr, weight_decay))


def densify_grads(params: "list[torch.nn.Parameter]") -> None:
    """Sparse gradients (summed over ranks already) as dense ones, for an optimizer without sparse support."""
    for p in params:
        if p.grad is not None and p.grad.is_sparse:
            p.grad = p.grad.to_dense()


def dense_optimizer(name: str, params: list[dict[str, Any]], lr: float, weight_decay: float) -> torch.optim.Optimizer:
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
    `trainers.optim.drift_gauge.DriftGauge.level`, or 1 with `optim.adaptive_stream_lr` off (measured:
    docs/benchmarks.md)."""
    if phase == "batch":
        return {"ids": lr, "shared": lr}
    per_sample = lr * min(1.0, stream_batch_size / batch_size)
    high = stream_lr or lr
    return {"ids": per_sample, "shared": per_sample + min(1.0, max(0.0, drift)) * (high - per_sample)}


def set_lrs(opt: torch.optim.Optimizer, lrs: dict[str, float], table_scale: float = 1.0) -> None:
    """Apply `phase_lrs`: a pure function of the config and the phase, so a resumed run sets the
    same rates whatever its checkpoint's optimizer state says. The groups of the tables' own
    optimizer (sparse, or a sharded run's fused ones) run at `table_scale` times their group's rate
    (`optim.table_lr / optim.lr`)."""
    for group in opt.param_groups:
        fused = "name" not in group  # a sharded run's fused table groups have no name: per-id tables
        group["lr"] = lrs[group.get("name", "ids")] * (table_scale if fused or group.get("tables") else 1.0)


def sharded_optimizer(sharded: nn.Module, name: str, lr: float, weight_decay: float) -> Any:
    """The tables' fused optimizer (stepped in backward) and `name` over the dense parameters, as
    one optimizer; the dense group is named `shared`, the tables' groups have no name (`ids`)."""
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    dense = dict(in_backward_optimizer_filter(sharded.named_parameters()))
    wrapped = KeyedOptimizerWrapper(dense, lambda params: dense_optimizer(
        name, [{"params": list(params), "name": "shared"}], lr, weight_decay))
    return CombinedOptimizer([sharded.fused_optimizer, wrapped])  # type: ignore[attr-defined]
