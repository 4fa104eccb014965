"""`slipstream bench embeddings --json`: what the embedding tables cost between two training
processes: today's trainer (data parallel with sparse gradients, or its tables sharded by TorchRec)
against dense data parallelism, on the same batches.

Two processes (gloo on 127.0.0.1, CPU) train the zoo's DLRM on the synthetic spec with the
`user_id` table grown to `--rows` rows (10,000,019 by default, `embed_dim` 16), on the same
generated batches, three times:
- `dense_ddp`: the tables with dense gradients under DDP, Adam: every step all-reduces every row
  of every table (the trainer before TorchRec);
- `sparse` (`model.sharding=none`): every rank holds every table; the rows a batch touched travel
  between ranks (`trainers.parallel.grad_exchange`), stepped by `optim.table_optimizer=sparse_adam`;
- `sharded` (`model.sharding`, `--sharding`, default column_wise: at two ranks, table-wise would
  place the one large table whole on one rank): TorchRec shards the tables over the two ranks, ids
  and pooled vectors travel by all-to-all, tables stepped by the fused Adagrad in backward.
`comm_bytes_per_step`: the bytes a rank hands to collectives per step: DDP's buckets (a
communication hook), the sparse exchange's all-gathers, and TorchRec's all-to-alls (their input,
less the part that stays on the rank); the per-step loss/count all-reduces are equal in all and
left out. `comm_vs_ddp_dense` is the trainer's (sparse, the default) / dense (goal <= 0.1), with the
sharded one beside it. `table_bytes_per_rank_vs_replicated`: the sharded run's table bytes on the
fuller rank / a full replica (goal <= 0.6). `samples_per_s` counts both ranks' samples over the
timed steps (after 3 warm-up steps).

The long-tail case (`bench.support.longtail`; `--case longtail`): managed id tables against hashed
ones on a stream generated for a spec (`--lt-spec`, default ratings): an id space 20x the table's
rows, Zipf-distributed, 30 % of the stream's distinct ids new after T. One process trains three
models with the trainer's own step in lockstep on the same batches (one pass before T, then the
stream scored before it is trained on): managed tables, hashed tables at the same memory (the maps'
bytes given to the hashed tables as extra rows: `*_hashed`) and hashed at the same rows
(`*_hashed_same_rows`). `collision_rate_*`: share of the stream's live ids (hashed: every id;
managed: the admitted ones) that share their row with another; `auc_after_t_*` (every stream row)
and `auc_gain_ci_low`, the lower 95 % bound of managed minus hashed from a bootstrap over users;
`auc_new_ids_*`: the rows whose user or item was new at T; `rows_in_use_*`; `step_time_vs_hashed`:
the mean step of managed / hashed at the same rows, the map's work included. Beside it (`map_*`),
our id -> row map against TorchRec's managed-collision module on the same Zipf id stream
(`bench.support.id_maps`).
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
VARIANTS = ("dense_ddp", "sparse", "sharded")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slipstream bench embeddings")
    p.add_argument("--rows", type=int, default=10_000_019, help="rows of the user_id table")
    p.add_argument("--batch", type=int, default=1024, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant (after 3 warm-up steps)")
    p.add_argument("--sharding", default="column_wise",
                   help="model.sharding of the sharded variant (column_wise: at two ranks table-wise would put the "
                        "one large table whole on one rank)")
    p.add_argument("--case", choices=("all", "comm", "longtail"), default="all",
                   help="comm: the two-process communication case; longtail: hashed against managed tables")
    p.add_argument("--lt-spec", default="ratings", help="long-tail case: the feature spec its data is generated for")
    p.add_argument("--lt-rows", type=int, default=4_000, help="long-tail case: rows of each id table (both kinds)")
    p.add_argument("--lt-before", type=int, default=240_000, help="long-tail case: samples before T")
    p.add_argument("--lt-after", type=int, default=80_000, help="long-tail case: stream samples after T")
    p.add_argument("--lt-admit-after", type=int, default=3, help="long-tail case: the managed tables' admit_after")
    p.add_argument("--lt-eviction", default="lru", choices=("lru", "lfu"), help="long-tail case: the managed tables' eviction")
    p.add_argument("--lt-seed", type=int, default=0)
    p.add_argument("--map-rows", type=int, default=100_000, help="map comparison: rows of the table")
    p.add_argument("--map-ids", type=int, default=4_096, help="map comparison: ids per step")
    p.add_argument("--map-steps", type=int, default=60, help="map comparison: steps (3 warm-up steps first)")
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


def _count_all_to_all(counter: dict[str, float], world: int) -> None:
    """Count what TorchRec's all-to-alls send to other ranks (their input, less this rank's own part)."""
    real = dist.all_to_all_single

    def counted(output: torch.Tensor, input: torch.Tensor, output_split_sizes: Any = None,
                input_split_sizes: Any = None, *args: Any, **kwargs: Any) -> Any:
        rows = input.shape[0] if input.dim() else 1
        row_bytes = input.numel() * input.element_size() / max(rows, 1)
        own = input_split_sizes[dist.get_rank()] if input_split_sizes else rows / world
        counter["bytes"] += (rows - own) * row_bytes
        return real(output, input, output_split_sizes, input_split_sizes, *args, **kwargs)

    dist.all_to_all_single = counted  # type: ignore[assignment]


def _variant(name: str, rank: int, world: int, args: argparse.Namespace, batches: list[Any],
             a2a: dict[str, float]) -> dict[str, float]:
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from slipstream.samples.schema import DEFAULT_SPEC
    from trainers.config.schema import ModelConfig
    from trainers.parallel.dist import Dist
    from trainers.optim.groups import build_optimizer
    from trainers.models import build_model
    from trainers.optim.groups import sharded_optimizer
    from trainers.parallel.sharding import shard_model
    from trainers.parallel.grad_exchange import data_parallel

    mc = ModelConfig(embed_dim=16, buckets={"user_id": args.rows}, sharding=args.sharding if name == "sharded" else "none")
    model = build_model(DEFAULT_SPEC, mc, seed=0)
    counter = {"bytes": 0.0}
    exchange = None
    if name == "sharded":
        net: torch.nn.Module = shard_model(model, mc, "adagrad", 0.01, Dist(rank, world, rank, torch.device("cpu"), "gloo"))
        opt: Any = sharded_optimizer(net, "adam", 0.003, 0.0)
        ddp = next(m for m in net.modules() if isinstance(m, DDP))
    elif name == "dense_ddp":
        for m in model.modules():
            if isinstance(m, torch.nn.EmbeddingBag):
                m.sparse = False
        opt = build_optimizer(model, "adam", 0.003, 0.0, None, "dense")
        net = ddp = DDP(model)
    else:  # the trainer's data-parallel path: DDP for the dense part, the exchange for the tables
        net, exchange = data_parallel(model, world, torch.device("cpu"))
        opt = build_optimizer(model, "adam", 0.003, 0.0, None, "sparse_adam")
        ddp = net  # the bare model when its small dense part travels in the exchange (counted there)
    if isinstance(ddp, DDP):
        ddp.register_comm_hook(None, _count_hook(counter, world))
    t0 = 0.0
    for i, f in enumerate(batches):
        if i == 3:
            dist.barrier()
            counter["bytes"], a2a["bytes"], t0 = 0.0, 0.0, time.perf_counter()
            if exchange is not None:
                exchange.sent_bytes = 0
        loss = F.binary_cross_entropy_with_logits(net(f), f.label)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if exchange is not None:
            exchange()
        opt.step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    steps = len(batches) - 3
    comm = counter["bytes"] + a2a["bytes"] + (exchange.sent_bytes if exchange is not None else 0)
    return {"comm_bytes_per_step": comm / steps, "samples_per_s": world * args.batch * steps / elapsed,
            "table_bytes_per_rank": float(_table_bytes(net))}


def _table_bytes(net: torch.nn.Module) -> int:
    """Bytes of the embedding tables this rank holds (a sharded table: its local shards)."""
    from trainers.parallel.sharding import local_tensors

    state = {k: v for k, v in net.state_dict().items() if ".embedding_bags." in k}
    return sum(t.numel() * t.element_size() for t in local_tensors(state))


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from slipstream.dev.datagen import GeneratorConfig, reference_samples
    from trainers.data.rows import Features, Rows

    gen = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=world * args.batch * (args.steps + 3),
                          seed=rank)
    rows = Rows.from_arrow(next(iter(reference_samples(gen).values())), source=0)
    batches = [Features.from_rows(rows.slice(i * args.batch, (i + 1) * args.batch)) for i in range(args.steps + 3)]
    a2a = {"bytes": 0.0}
    _count_all_to_all(a2a, world)
    result = {name: _variant(name, rank, world, args, batches, a2a) for name in VARIANTS}
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    out = comm_case(args) if args.case in ("all", "comm") else {}
    if args.case in ("all", "longtail"):
        out.update(longtail_case(args))
    out.update(load_avg_1m=round(os.getloadavg()[0], 2), cpu_count=os.cpu_count())
    return out


def longtail_case(args: argparse.Namespace) -> dict[str, Any]:
    from bench.support.id_maps import compare
    from bench.support.longtail import LongTail, measure
    from slipstream.samples.spec import load_spec

    torch.set_num_threads(1)
    cfg = LongTail(rows=args.lt_rows, before=args.lt_before, after=args.lt_after, admit_after=args.lt_admit_after,
                   eviction=args.lt_eviction, seed=args.lt_seed)
    t0 = time.monotonic()

    def progress(done: int, total: int) -> None:
        if done % 200 == 0 or done == total:
            rate = done / max(time.monotonic() - t0, 1e-9)
            log.info("long-tail case: step %d of %d (%.1f steps/s, about %.0f s left)", done, total, rate,
                     (total - done) / max(rate, 1e-9))

    with tempfile.TemporaryDirectory(prefix="bench-longtail-") as tmp:
        out = measure(load_spec(args.lt_spec), cfg, Path(tmp), progress)
    log.info("map comparison: our id -> row map against TorchRec's MCH, %d rows", args.map_rows)
    out.update(compare(args.map_rows, args.map_ids, args.map_steps))
    return out


def comm_case(args: argparse.Namespace) -> dict[str, Any]:
    world = 2
    with tempfile.TemporaryDirectory(prefix="bench-emb-") as tmp:
        mp.spawn(_worker, args=(world, _free_port(), args, tmp), nprocs=world, join=True)
        ranks = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=True) for r in range(world)]
    dense, sparse, sharded = (ranks[0][v] for v in VARIANTS)
    comm = lambda v: max(r[v]["comm_bytes_per_step"] for r in ranks)  # noqa: E731  (the busier rank)
    fuller = max(r["sharded"]["table_bytes_per_rank"] for r in ranks)
    return {
        "table_rows": args.rows, "embed_dim": 16, "world": world, "sharding": args.sharding, "batch_per_rank": args.batch, "steps": args.steps,
        "comm_bytes_per_step": comm("sparse"), "comm_bytes_per_step_ddp_dense": comm("dense_ddp"),
        "comm_vs_ddp_dense": round(comm("sparse") / comm("dense_ddp"), 5),
        "comm_bytes_per_step_sharded": comm("sharded"),
        "comm_vs_ddp_dense_sharded": round(comm("sharded") / comm("dense_ddp"), 5),
        "table_bytes_per_rank_replicated": dense["table_bytes_per_rank"],
        "table_bytes_per_rank_sharded": fuller,
        "table_bytes_per_rank_vs_replicated": round(fuller / dense["table_bytes_per_rank"], 3),
        "samples_per_s": round(sparse["samples_per_s"], 1), "samples_per_s_sharded": round(sharded["samples_per_s"], 1),
        "samples_per_s_ddp_dense": round(dense["samples_per_s"], 1),
    }
