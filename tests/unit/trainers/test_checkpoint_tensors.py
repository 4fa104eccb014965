"""Sharded model checkpoints (trainers.checkpoint.tensors): written by two gloo processes, each rank writes
part of the tensors, and one process reads the whole state back; a checkpoint's metadata that
would run code is refused."""

from __future__ import annotations

import os
import pickle
import socket
from datetime import date
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainers.checkpoint.store import Checkpointer
from trainers.checkpoint.tensors import SHARDS, join, load_tensors, refs, split
from trainers.parallel.grad_exchange import MARK_MAX_SPACE_PER_ID, _sum_rows


def _state() -> dict:
    g = torch.Generator().manual_seed(7)
    return {"model": {"tables.user.weight": torch.randn(1000, 8, generator=g), "mlp.0.bias": torch.randn(16, generator=g)},
            "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(16, generator=g)}},
                          "param_groups": [{"lr": 0.01, "name": "ids", "params": [0]}]},
            "step": 12, "betas": (0.9, 0.999)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _save_rank(rank: int, world: int, root: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ck = Checkpointer(Path(root), rank, dist.barrier)
        meta = {"step": 12, "phase": "stream", "world": world} if rank == 0 else None
        ck.save(12, _state(), {"rank": rank}, meta)
    finally:
        dist.destroy_process_group()


def test_two_ranks_write_one_reads(tmp_path: Path) -> None:
    root = tmp_path / "checkpoint"
    mp.start_processes(_save_rank, args=(2, str(root), _free_port()), nprocs=2, join=True, start_method="spawn")
    ck = Checkpointer(root, 0, lambda: None)
    latest = ck.latest()
    assert latest is not None and latest.name == "step-000000012"
    files = {p.name: p.stat().st_size for p in (latest / SHARDS).glob("*.distcp")}
    assert set(files) == {"__0_0.distcp", "__1_0.distcp"} and all(files.values()), files  # both ranks wrote tensors
    # the big table is written once, not once per rank
    assert sum(files.values()) < 1.5 * 1000 * 8 * 4
    back = ck.load_model(latest)  # one process, no process group
    want = _state()
    assert torch.equal(back["model"]["tables.user.weight"], want["model"]["tables.user.weight"])
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], want["optimizer"]["state"][0]["exp_avg"])
    assert back["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    assert back["step"] == 12 and back["betas"] == (0.9, 0.999)


def test_split_and_join_round_trip() -> None:
    rest, tensors = split(_state())
    assert sorted(refs(rest)) == sorted(tensors) and "optimizer.state.0.exp_avg" in tensors
    assert not any(isinstance(v, torch.Tensor) for v in _leaves(rest))
    back = join(rest, tensors)
    assert torch.equal(back["model"]["mlp.0.bias"], _state()["model"]["mlp.0.bias"]) and back["step"] == 12


def _leaves(tree: object) -> list[object]:
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _leaves(v)]
    if isinstance(tree, (list, tuple)):
        return [x for v in tree for x in _leaves(v)]
    return [tree]


class _Boom:
    def __reduce__(self) -> tuple:
        return (os.system, ("echo pwned > /dev/null",))


def test_metadata_that_would_run_code_is_refused(tmp_path: Path) -> None:
    from trainers.checkpoint.tensors import save_tensors

    folder = tmp_path / SHARDS
    save_tensors({"w": torch.ones(3)}, folder)
    assert torch.equal(load_tensors(folder, ["w"])["w"], torch.ones(3))
    (folder / ".metadata").write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        load_tensors(folder, ["w"])


def _exchange_rank(rank: int, world: int, port: int, out: str) -> None:
    from trainers.parallel.grad_exchange import SparseGradExchange

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        bag = torch.nn.EmbeddingBag(50, 4, mode="sum", sparse=True)
        torch.nn.init.ones_(bag.weight)
        ids = [torch.tensor([[1], [3], [3]]), torch.tensor([[3], [7]])][rank]  # rank 1 touches 3 and 7
        if rank == 0:
            bag(ids).sum().backward()
        else:  # an idle rank (no rows) still joins the exchange
            bag(ids[:0]).sum().backward()
        lin = torch.nn.Parameter(torch.zeros(3))  # a dense weight beside the table, averaged whole
        lin.grad = torch.full((3,), float(rank + 1))
        # two more tables: one as wide as `bag` (exchanged in the same id space), one narrower
        same = torch.nn.EmbeddingBag(30, 4, mode="sum", sparse=True)
        narrow = torch.nn.EmbeddingBag(20, 1, mode="sum", sparse=True)
        torch.nn.init.ones_(same.weight)
        torch.nn.init.ones_(narrow.weight)
        same(torch.tensor([[0], [29]]) if rank else torch.tensor([[29]])).sum().backward()
        narrow(torch.tensor([[5], [5]])).sum().backward()
        exchange = SparseGradExchange({"weight": bag.weight, "same": same.weight, "narrow": narrow.weight}, world,
                                      dense={"lin": lin})
        totals = exchange([[3, 1], [0, 0]][rank])  # each rank's row count and a flag, summed
        sent, first_gathers = exchange.sent_bytes, exchange.gathers
        grads = [t.grad.to_dense().clone() for t in (bag.weight, same.weight, narrow.weight)]
        for t in (bag.weight, same.weight, narrow.weight):  # the same step again: it fits the room now
            t.grad = None
        bag(ids if rank == 0 else ids[:0]).sum().backward()
        same(torch.tensor([[0], [29]]) if rank else torch.tensor([[29]])).sum().backward()
        narrow(torch.tensor([[5], [5]])).sum().backward()
        lin.grad = torch.full((3,), float(rank + 1))
        again = exchange([[3, 1], [0, 0]][rank])
        same_again = all(torch.equal(g, t.grad.to_dense()) for g, t in zip(grads, (bag.weight, same.weight, narrow.weight)))
        gathers = exchange.gathers
        before = bag.weight.grad.to_dense().clone()
        when_empty = exchange([0, 1])  # no rank has a row: the sums, and the gradients stay
        torch.save({"grad": grads[0], "same": grads[1], "narrow": grads[2], "sent": sent, "lin": lin.grad,
                    "totals": totals, "again": again, "same_again": same_again,
                    "gathers": [first_gathers, gathers, exchange.gathers],
                    "when_empty": when_empty, "untouched": torch.equal(before, bag.weight.grad.to_dense())},
                   Path(out) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_the_sparse_exchange_averages_the_touched_rows_over_ranks(tmp_path: Path) -> None:
    mp.start_processes(_exchange_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    got = [torch.load(tmp_path / f"{r}.pt", weights_only=True) for r in range(2)]
    want = torch.zeros(50, 4)
    want[1], want[3] = 0.5, 1.0  # rank 0's rows (1 once, 3 twice) / 2 ranks; rank 1 had none
    for g in got:
        assert torch.equal(g["grad"], want)
        assert torch.equal(g["lin"], torch.full((3,), 1.5))  # (1 + 2) / 2 ranks, as DDP would
        assert g["totals"] == [3, 1] and g["when_empty"] == [0, 2]
        want_same = torch.zeros(30, 4)
        want_same[0], want_same[29] = 0.5, 1.0  # 29 on both ranks, 0 on rank 1: summed, / 2 ranks
        want_narrow = torch.zeros(20, 1)
        want_narrow[5] = 2.0  # twice on each rank
        assert torch.equal(g["same"], want_same) and torch.equal(g["narrow"], want_narrow)
        assert g["untouched"] and g["again"] == [3, 1] and g["same_again"]
        # the first step has no room yet (two all-gathers), the next fits (one), so does the empty one
        assert g["gathers"] == [2, 3, 4]
    assert 0 < got[0]["sent"] < (50 + 30) * 4 * 4  # a few rows, never the whole tables


def test_sharding_refuses_what_the_cpu_cannot_run() -> None:
    from slipstream.errors import ConfigError
    from trainers.config.schema import ModelConfig
    from trainers.parallel.sharding import check_sharding

    cpu = torch.device("cpu")
    assert check_sharding(ModelConfig(sharding="auto"), "adagrad", cpu) == ["table_wise", "column_wise"]
    with pytest.raises(ConfigError, match="table_optimizer=adagrad"):
        check_sharding(ModelConfig(sharding="table_wise"), "sparse_adam", cpu)
    with pytest.raises(ConfigError, match="row_wise has no kernel on cpu"):
        check_sharding(ModelConfig(sharding="row_wise"), "adagrad", cpu)
    with pytest.raises(ConfigError, match="divisible by 4"):
        check_sharding(ModelConfig(sharding="auto", embed_dim=6), "adagrad", cpu)


def _stepper_setup(root: Path) -> tuple:
    """A sharded stepper's config (column-wise tables, fused Adagrad at its own rate) and rows of
    the synthetic spec; every process builds the same ones."""
    import pyarrow as pa

    from slipstream.dev.specgen import SpecGenConfig, generate_spec
    from slipstream.samples.spec import load_spec
    from slipstream.settings import Settings
    from trainers.config.schema import load_config
    from trainers.data.rows import RowLayout, Rows

    spec = load_spec("synthetic")
    cfg = load_config(None, ["data.snapshot_id=1", "data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=r",
                             "model.sharding=column_wise", "optim.table_optimizer=adagrad", "optim.table_lr=0.05"],
                      Settings(home=root / "home"))
    gen = generate_spec(spec, SpecGenConfig(start_day=date(2026, 11, 1), days=1, events_per_day=3000, users=300,
                                            items=80, seed=3), root / "gen")
    rows = Rows.from_arrow(pa.concat_tables(gen.batch.values()), RowLayout.from_spec(spec), source=0)
    return spec, cfg, rows


def _local_state(stepper: object) -> dict[str, torch.Tensor]:
    """This rank's model and optimizer tensors, a shard keyed by its offsets."""
    from trainers.checkpoint.tensors import is_sharded, split

    out: dict[str, torch.Tensor] = {}
    state = {"model": stepper.net.state_dict(), "optimizer": stepper.opt.state_dict()}  # type: ignore[attr-defined]
    for key, t in split(state)[1].items():
        if is_sharded(t):
            for s in t.local_shards():
                out[f"{key}@{tuple(s.metadata.shard_offsets)}"] = s.tensor.detach().clone()
        else:
            out[key] = t.detach().clone()
    return out


def _whole(parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Shards (`key@offsets`) put together into whole tensors."""
    out, shards = {}, {}
    for key, t in parts.items():
        name, _, offsets = key.partition("@")
        if offsets:
            shards.setdefault(name, []).append((tuple(int(x) for x in offsets.strip("()").split(",") if x.strip()), t))
        else:
            out[key] = t
    for name, pieces in shards.items():
        size = [max(o[i] + t.shape[i] for o, t in pieces) for i in range(pieces[0][1].dim())]
        whole = torch.full(size, float("nan"))
        for o, t in pieces:
            whole[tuple(slice(a, a + n) for a, n in zip(o, t.shape))] = t
        out[name] = whole
    return out


def _train_and_save_rank(rank: int, world: int, port: int, root: str) -> None:
    from trainers.parallel.dist import Dist
    from trainers.step import Stepper

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        spec, cfg, rows = _stepper_setup(Path(root))
        stepper = Stepper(cfg, Dist(rank=rank, world=world, local_rank=rank, device=torch.device("cpu"), backend="gloo"), spec)
        stepper.set_lr("batch")
        for i in range(12):
            lo = (i * world + rank) * 64
            stepper.step(rows.slice(lo, lo + 64), 64)
        Checkpointer(Path(root) / "ckpt", rank, dist.barrier).save(
            12, {**stepper.state_dict(), "step": 12}, {"rank": rank}, {"step": 12, "world": world} if rank == 0 else None)
        lrs = sorted({(g.get("name", "fused"), g["lr"]) for g in stepper.opt.param_groups})
        torch.save({"state": _local_state(stepper), "lrs": lrs}, Path(root) / f"saved-{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_a_sharded_checkpoint_of_two_ranks_restores_exactly_on_one(tmp_path: Path) -> None:
    """Column-wise tables trained by 2 ranks (each holds half of every table's columns and of its
    Adagrad state), checkpointed, loaded in place by 1 process: every weight and every optimizer
    state is the saved one, bit for bit; the fused tables ran at `optim.table_lr`."""
    from trainers.parallel.dist import Dist
    from trainers.step import Stepper

    mp.start_processes(_train_and_save_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    saved = [torch.load(tmp_path / f"saved-{r}.pt", weights_only=True) for r in range(2)]
    assert saved[0]["lrs"] == [("fused", 0.05), ("shared", 0.003)]  # the tables at table_lr, the dense part at lr
    # both ranks hold a part of the user table: column-wise
    assert any(k.startswith("model.") and "user_id" in k and "@" in k for k in saved[1]["state"])
    want = _whole({**saved[0]["state"], **saved[1]["state"]})
    assert not any(bool(t.isnan().any()) for t in want.values() if t.is_floating_point())  # the shards cover the tables

    spec, cfg, _ = _stepper_setup(tmp_path)
    try:  # a sharded model in this process: a process group of one
        stepper = Stepper(cfg, Dist(rank=0, world=1, local_rank=0, device=torch.device("cpu"), backend="gloo"), spec)
        ck = Checkpointer(tmp_path / "ckpt", 0, lambda: None)
        stepper.load_state_dict(ck.load_model(ck.latest(), into=stepper.live_state()))  # type: ignore[arg-type]
        got = _whole(_local_state(stepper))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert sorted(got) == sorted(want)
    assert any("momentum1" in k for k in got)  # the fused Adagrad's state is among them
    for key, t in want.items():
        assert torch.equal(got[key], t), key


@pytest.mark.parametrize("space, n", [(40, 200), (45_000, 12_000), (1_000_000, 500), (7, 0)])
def test_rows_are_summed_alike_marked_or_sorted(space: int, n: int) -> None:
    # dense ids (marked: the space is at most MARK_MAX_SPACE_PER_ID per id) and sparse ones (sorted)
    g = torch.Generator().manual_seed(space)
    ids = (torch.rand(n, generator=g) ** 3 * space).long()
    values = torch.randn(n, 3, generator=g, dtype=torch.float64)
    unique, sums = _sum_rows(ids, values, space)
    want = torch.zeros(space, 3, dtype=torch.float64).index_add_(0, ids, values)
    assert torch.equal(unique, torch.unique(ids))
    assert torch.allclose(sums, want[unique])
    assert (space <= MARK_MAX_SPACE_PER_ID * n) == ((space, n) in ((40, 200), (45_000, 12_000)))
