"""`slipstream bench embeddings --json`: what the embedding tables cost between two training
processes, today's dense data parallelism against the trainer's sparse one, on the same batches.

Two processes (gloo on 127.0.0.1, CPU) train the zoo's DLRM on the synthetic spec with the
`user_id` table grown to `--rows` rows (10,000,019 by default, `embed_dim` 16), on the same
generated batches, twice:
- `dense_ddp`: the tables with dense gradients under DDP, Adam: every step all-reduces every row
  of every table (the trainer before TorchRec);
- `sparse`: the trainer's tables (sparse gradients: DDP exchanges the rows the batch touched),
  stepped by `optim.table_optimizer=sparse_adam`.
A DDP communication hook counts the gradient bytes each rank hands to the all-reduce per step
(`comm_bytes_per_step`: tables and dense parts; the per-step loss/count all-reduces are equal
in both and left out); `comm_vs_ddp_dense` is sparse / dense (goal <= 0.1). Both keep a full
replica of every table on each rank (`table_bytes_per_rank_vs_replicated` 1.0, the reason
beside it). `samples_per_s` counts both ranks' samples over the timed steps (after warm-up).
"""



import argparse
import logging
import os
import socket
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

log = logging.getLogger(__name__)
SHARDING_NOTE = ("data parallel: every rank holds every table. TorchRec 1.9.2 with fbgemm-gpu-cpu shards "
                 "table-wise and column-wise on CPU/gloo (FUSED kernel) but not row-wise; the trainer does "
                 "not run DistributedModelParallel yet (docs/trainer.md)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slipstream bench embeddings")
    p.add_argument("--rows", type=int, default=10_000_019, help="rows of the user_id table")
    p.add_argument("--batch", type=int, default=1024, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant (after 3 warm-up steps)")
    return p.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _count_hook(counter: dict[str, float], world: int):  # type: ignore[no-untyped-def]
    def hook(_: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        t = bucket.buffer()
        if t.is_sparse:
            t = t.coalesce()
            counter["bytes"] += t.indices().numel() * t.indices().element_size() + t.values().numel() * t.values().element_size()
        else:
            counter["bytes"] += t.numel() * t.element_size()
        t = t / world
        return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])
    return hook


def _variant(name: str, rank: int, world: int, args: argparse.Namespace, batches: list[Any]) -> dict[str, float]:
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from slipstream.samples.schema import DEFAULT_SPEC
    from trainers.config import ModelConfig
    from trainers.model import build_optimizer
    from trainers.models import build_model

    model = build_model(DEFAULT_SPEC, ModelConfig(embed_dim=16, buckets={"user_id": args.rows}), seed=0)
    if name == "dense_ddp":
        for m in model.modules():
            if isinstance(m, torch.nn.EmbeddingBag):
                m.sparse = False
    opt = build_optimizer(model, "adam", 0.003, 0.0, None, "dense" if name == "dense_ddp" else "sparse_adam")
    net = DDP(model)
    counter = {"bytes": 0.0}
    net.register_comm_hook(None, _count_hook(counter, world))
    t0 = 0.0
    for i, f in enumerate(batches):
        if i == 3:
            dist.barrier()
            counter["bytes"], t0 = 0.0, time.perf_counter()
        loss = F.binary_cross_entropy_with_logits(net(f), f.label)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    steps = len(batches) - 3
    table_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".embedding_bags." in n)
    return {"comm_bytes_per_step": counter["bytes"] / steps, "samples_per_s": world * args.batch * steps / elapsed,
            "table_bytes_per_rank": float(table_bytes)}


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from slipstream.dev.datagen import GeneratorConfig, reference_samples
    from trainers.rows import Features, Rows

    gen = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=world * args.batch * (args.steps + 3),
                          seed=rank)
    rows = Rows.from_arrow(next(iter(reference_samples(gen).values())), source=0)
    batches = [Features.from_rows(rows.slice(i * args.batch, (i + 1) * args.batch)) for i in range(args.steps + 3)]
    result = {name: _variant(name, rank, world, args, batches) for name in ("dense_ddp", "sparse")}
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    world = 2
    with tempfile.TemporaryDirectory(prefix="bench-emb-") as tmp:
        mp.spawn(_worker, args=(world, _free_port(), args, tmp), nprocs=world, join=True)
        ranks = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=True) for r in range(world)]
    dense, sparse = ranks[0]["dense_ddp"], ranks[0]["sparse"]
    comm = lambda v: max(r[v]["comm_bytes_per_step"] for r in ranks)  # noqa: E731  (the busier rank)
    return {
        "table_rows": args.rows, "embed_dim": 16, "world": world, "batch_per_rank": args.batch, "steps": args.steps,
        "comm_bytes_per_step": comm("sparse"), "comm_bytes_per_step_ddp_dense": comm("dense_ddp"),
        "comm_vs_ddp_dense": round(comm("sparse") / comm("dense_ddp"), 5),
        "table_bytes_per_rank": sparse["table_bytes_per_rank"],
        "table_bytes_per_rank_vs_replicated": round(sparse["table_bytes_per_rank"] / dense["table_bytes_per_rank"], 3),
        "table_sharding": SHARDING_NOTE,
        "samples_per_s": round(sparse["samples_per_s"], 1), "samples_per_s_ddp_dense": round(dense["samples_per_s"], 1),
        "load_avg_1m": round(os.getloadavg()[0], 2), "cpu_count": os.cpu_count(),
    }
