"""Our id -> row map (`trainers.models.managed.IdRowMap`) against TorchRec's managed-collision
module (`torchrec.modules.mc_modules.ManagedCollisionCollection` over an `MCHManagedCollisionModule`
with its LRU policy) on the same stream of ids: the time of one training step's map work (count
the step's ids, admit and evict, map every id to its row), one process, CPU.

Both admit every new id at once (our `admit_after: 0`, LRU; TorchRec's MCH with
`eviction_interval` 1 admits at every step, as ours does; a longer interval amortises its re-sort
over more steps, and new ids wait that many steps on the shared row meanwhile).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch


def zipf_batches(rows: int, space_factor: int, batch: int, steps: int, seed: int, a: float = 1.05) -> list[torch.Tensor]:
    """`steps` batches of `batch` 64-bit ids drawn Zipf(a) from an id space `space_factor` x `rows`."""
    rng = np.random.default_rng(seed)
    space = rows * space_factor
    ids = rng.integers(0, 2**62, space)
    p = 1.0 / np.arange(1, space + 1) ** a
    p /= p.sum()
    return [torch.from_numpy(ids[rng.choice(space, batch, p=p)]) for _ in range(steps)]


def time_ours(batches: list[torch.Tensor], rows: int, warmup: int = 3) -> tuple[float, torch.Tensor]:
    from slipstream.samples.spec import TableOptions
    from trainers.models.managed import IdRowMap

    m = IdRowMap("t", TableOptions(rows=rows, eviction="lru"))
    out = torch.zeros(0, dtype=torch.int64)
    t0 = 0.0
    for i, ids in enumerate(batches):
        if i == warmup:
            t0 = time.perf_counter()
        u, c = torch.unique(ids, return_counts=True)
        m.observe(u, c, i)
        out = m.lookup(ids)
    return (time.perf_counter() - t0) / (len(batches) - warmup), out


def time_torchrec(batches: list[torch.Tensor], rows: int, interval: int, warmup: int = 3) -> float:
    from torchrec import KeyedJaggedTensor
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.mc_modules import LRU_EvictionPolicy, ManagedCollisionCollection, MCHManagedCollisionModule

    mch = MCHManagedCollisionModule(zch_size=rows, device=torch.device("cpu"), eviction_policy=LRU_EvictionPolicy(),
                                    eviction_interval=interval)
    mcc = ManagedCollisionCollection({"t": mch}, [EmbeddingBagConfig(name="t", embedding_dim=8, num_embeddings=rows,
                                                                     feature_names=["f"])])
    mcc.train()
    t0 = 0.0
    for i, ids in enumerate(batches):
        if i == warmup:
            t0 = time.perf_counter()
        kjt = KeyedJaggedTensor(keys=["f"], values=ids, lengths=torch.ones(len(ids), dtype=torch.int64))
        mcc(kjt)
        mch.evict()  # what a managed-collision embedding module does after each forward
    return (time.perf_counter() - t0) / (len(batches) - warmup)


def compare(rows: int, batch: int, steps: int, seed: int = 0) -> dict[str, Any]:
    """ms per step of our map and of TorchRec's MCH (interval 1 and 10) on one Zipf stream."""
    batches = zipf_batches(rows, 20, batch, steps, seed)
    ours, _ = time_ours(batches, rows)
    mch1 = time_torchrec(batches, rows, 1)
    mch10 = time_torchrec(batches, rows, 10)
    return {"map_rows": rows, "map_ids_per_step": batch, "map_steps": steps,
            "map_step_ms_ours": round(ours * 1e3, 3), "map_step_ms_torchrec_mch": round(mch1 * 1e3, 3),
            "map_step_ms_torchrec_mch_interval10": round(mch10 * 1e3, 3),
            "map_torchrec_vs_ours": round(mch1 / ours, 2)}
