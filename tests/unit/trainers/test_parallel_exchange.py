"""data.exchange building blocks: the deterministic split of fresh rows and the all-to-all of objects."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainers.config.schema import DataConfig
from trainers.data.mixer import exchange_split
from trainers.parallel.dist import Dist
from trainers.data.rows import SOURCE_KAFKA, Rows


def _rows(n: int, partitions: int = 4) -> Rows:
    hist_len = np.arange(n) % 3
    return Rows(
        sparse=np.stack([np.arange(n), np.arange(n) * 2, np.zeros(n), np.zeros(n)], axis=1).astype(np.int64),
        dense=np.ones((n, 3), dtype=np.float32),
        list_values=(np.arange(int(hist_len.sum()), dtype=np.int64),),
        list_offsets=(np.concatenate([[0], np.cumsum(hist_len)]).astype(np.int64),),
        label=(np.arange(n) % 2).astype(np.float32), event_us=np.arange(n, dtype=np.int64),
        sample_id=pa.array([f"s-{i}" for i in range(n)], pa.string()),
        source=np.full(n, SOURCE_KAFKA, dtype=np.int8), epoch=np.zeros(n, dtype=np.int32),
        partition=(np.arange(n) % partitions).astype(np.int32), offset=np.arange(n, dtype=np.int64),
        record_ms=np.zeros(n, dtype=np.int64), consumed_ms=np.zeros(n, dtype=np.int64),
    )


def test_split_deals_every_row_to_exactly_one_piece_balanced() -> None:
    rows = _rows(103)
    pieces = exchange_split(rows, 4, seed=1, rank=0, step=5)
    assert len(pieces) == 4
    assert sorted(len(p) for p in pieces) == [25, 26, 26, 26]
    ids = [i for p in pieces for i in p.sample_id.to_pylist()]
    assert sorted(ids) == sorted(rows.sample_id.to_pylist())
    # each piece keeps its rows' columns together (history too)
    for p in pieces:
        idx = np.array([int(s[2:]) for s in p.sample_id.to_pylist()])
        assert (p.sparse[:, 0] == idx).all() and (p.partition == idx % 4).all()
        assert np.diff(p.list_offsets[0]).tolist() == (idx % 3).tolist()


def test_split_is_a_function_of_seed_rank_and_step() -> None:
    rows = _rows(64)

    def ids(**kw: int) -> list[list[str]]:
        return [p.sample_id.to_pylist() for p in exchange_split(rows, 2, **kw)]  # type: ignore[arg-type]

    assert ids(seed=0, rank=1, step=7) == ids(seed=0, rank=1, step=7)
    assert ids(seed=0, rank=1, step=7) != ids(seed=0, rank=1, step=8)
    assert ids(seed=0, rank=1, step=7) != ids(seed=1, rank=1, step=7)
    # every piece mixes partitions (the point of the exchange)
    assert all(set(p.partition.tolist()) == {0, 1, 2, 3} for p in exchange_split(rows, 2, seed=0, rank=0, step=0))


def test_split_edge_cases() -> None:
    assert [len(p) for p in exchange_split(Rows.empty(), 3, 0, 0, 0)] == [0, 0, 0]
    assert [len(p) for p in exchange_split(_rows(5), 1, 0, 0, 0)] == [5]
    assert sorted(len(p) for p in exchange_split(_rows(2), 3, 0, 0, 0)) == [0, 1, 1]


def test_world_of_one_all_to_all_is_the_identity() -> None:
    d = Dist(rank=0, world=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    assert d.all_to_all_object(["x"]) == ["x"]
    with pytest.raises(ValueError):
        d.all_to_all_object(["x", "y"])


def _worker(rank: int, world: int, port: int, q: "mp.SimpleQueue[object]") -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        d = Dist(rank=rank, world=world, local_rank=rank, device=torch.device("cpu"), backend="gloo")
        out = []
        # piece r of rank s is ("from", s, "to", r); rank 1 sends nothing to rank 0
        pieces = [None if (rank == 1 and r == 0) else ("from", rank, "to", r) for r in range(world)]
        out.append(d.all_to_all_object(pieces))
        out.append(d.all_to_all_object([None] * world))  # nothing at all: every rank skips the payload alike
        rows = _rows(10 * (rank + 1))
        got = d.all_to_all_object(exchange_split(rows, world, 0, rank, 3))
        out.append([g.sample_id.to_pylist() for g in got])
        q.put((rank, out))
    finally:
        dist.destroy_process_group()


def test_all_to_all_object_between_processes() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = 3
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(world, port, q), nprocs=world, start_method="spawn", join=True)
    results = dict(q.get() for _ in range(world))
    for r in range(world):
        sent, empty, rows = results[r]
        assert sent == [None if (s == 1 and r == 0) else ("from", s, "to", r) for s in range(world)]
        assert empty == [None] * world
    # the rows rank s dealt to rank r arrived at rank r, intact: all rows of all ranks arrived once
    for s in range(world):
        dealt = [p.sample_id.to_pylist() for p in exchange_split(_rows(10 * (s + 1)), world, 0, s, 3)]
        for r in range(world):
            assert results[r][2][s] == dealt[r]


def test_config_accepts_exchange() -> None:
    t = datetime(2026, 11, 3, tzinfo=timezone.utc).isoformat()
    assert DataConfig(snapshot_id=1, t_handoff=t, exchange=True).exchange is True
    assert DataConfig(snapshot_id=1, t_handoff=t).exchange is False
