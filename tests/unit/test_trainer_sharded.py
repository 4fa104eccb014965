"""Sharded model checkpoints (trainers.sharded): written by two gloo processes, each rank writes
part of the tensors, and one process reads the whole state back; a checkpoint's metadata that
would run code is refused."""

from __future__ import annotations

import os
import pickle
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainers.checkpoint import Checkpointer
from trainers.sharded import SHARDS, join, load_tensors, refs, split


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
    from trainers.sharded import save_tensors

    folder = tmp_path / SHARDS
    save_tensors({"w": torch.ones(3)}, folder)
    assert torch.equal(load_tensors(folder, ["w"])["w"], torch.ones(3))
    (folder / ".metadata").write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        load_tensors(folder, ["w"])
