"""Managed tables in training and serving: the step maps ids before the forward, a new id's row
starts from the shared row with fresh optimizer state, and an exported model scores rows with the
map training built (the same rows scored both ways give the same numbers)."""

from __future__ import annotations

import copy
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from slipstream.samples.spec import Spec, load_spec, spec_from_dict
from slipstream.settings import Settings
from trainers.config.schema import TrainConfig, load_config
from trainers.data.rows import RowLayout, Rows
from trainers.eval.scoring import score
from trainers.models.export import export_model, load_exported
from trainers.models.managed import IdRowMap
from trainers.parallel.dist import Dist
from trainers.step import Stepper

ONE = Dist(rank=0, world=1, local_rank=0, device=torch.device("cpu"), backend="gloo")


def managed_spec(users: dict[str, object], items: dict[str, object]) -> Spec:
    """The synthetic spec with managed user and item tables (`users`, `items`: their options)."""
    raw = copy.deepcopy(dict(load_spec("synthetic").raw))
    for name, opts in (("user_id", users), ("item_id", items)):
        f = raw["features"][name]
        f.pop("buckets")
        f.update(table="managed", **opts)
    return spec_from_dict(raw)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Spec, TrainConfig, Rows]:
    from slipstream.dev.specgen import SpecGenConfig, generate_spec

    root = tmp_path_factory.mktemp("managed")
    spec = managed_spec({"rows": 120, "admit_after": 1}, {"rows": 40, "eviction": "lfu"})
    cfg = load_config(None, ["data.snapshot_id=1", "data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=m",
                             "model.embed_dim=8", "model.bottom_mlp=[8]", "model.top_mlp=[8]"], Settings(home=root / "home"))
    gen = generate_spec(spec, SpecGenConfig(start_day=date(2026, 11, 1), days=1, events_per_day=2000, users=300,
                                            items=120, seed=5), root / "gen")
    rows = Rows.from_arrow(pa.concat_tables(gen.batch.values()), RowLayout.from_spec(spec), source=0)
    return spec, cfg, rows


def test_a_new_ids_row_starts_from_the_shared_row_with_fresh_optimizer_state(setup: tuple[Spec, TrainConfig, Rows]) -> None:
    spec, cfg, rows = setup
    st = Stepper(cfg, ONE, spec)
    st.set_lr("batch")
    items = st.model.tables.managed.maps["item_id"]
    for i in range(8):  # the item table (39 rows for 120 items) fills up and evicts
        st.step(rows.slice(i * 64, i * 64 + 64), 64)
    assert items.stats()["evicted"] > 0
    w = st.model.tables.vectors.embedding_bags["item_id"].weight
    bias = st.model.tables.biases.embedding_bags["item_id"].weight
    before = w.detach().clone()
    batch = rows.slice(8 * 64, 9 * 64)
    held = items.row_ids.clone()
    st.observe_ids(batch)
    new = torch.nonzero(items.row_ids != held).flatten()
    assert new.numel() > 0  # rows that changed hands, or were free, now hold new ids
    assert torch.equal(w[new].detach(), before[0].expand(len(new), -1))  # the shared row's vector
    assert torch.equal(bias[new].detach(), bias[0].detach().expand(len(new), -1))
    state = st.opt.state[w]
    assert all(torch.count_nonzero(v[new]) == 0 for v in state.values() if v.dim() and v.shape[0] == w.shape[0])
    kept = (items.row_ids == held) & (held != items.row_ids[0])
    assert torch.equal(w[kept].detach(), before[kept])  # nobody else's row moved


def test_the_exported_model_scores_rows_exactly_as_the_trained_one(setup: tuple[Spec, TrainConfig, Rows], tmp_path: Path) -> None:
    spec, cfg, rows = setup
    st = Stepper(cfg, ONE, spec)
    st.set_lr("batch")
    for i in range(12):
        st.step(rows.slice(i * 64, i * 64 + 64), 64)
    maps = st.model.tables.managed.maps
    assert maps["user_id"].rows_in_use > 5 and maps["item_id"].stats()["evicted"] > 0
    path = export_model(st.model, cfg, spec, tmp_path, step=12, phase="batch", positions={})
    served, served_spec = load_exported(path)
    assert served_spec.digest == spec.digest
    probe = rows.slice(0, 1500)  # trained rows and rows not seen: ids with and without rows
    trained = score(st.model, probe, torch.device("cpu"))
    assert np.array_equal(score(served, probe, torch.device("cpu")), trained)
    for name, m in maps.items():
        ids = torch.from_numpy(probe.sparse[:, [f.name for f in spec.sparse].index(name)])
        assert torch.equal(served.tables.managed.maps[name].lookup(ids), m.lookup(ids))
    # the map is what makes them equal: without it the same weights score these rows differently
    bare, _ = load_exported(path)
    for name, m in bare.tables.managed.maps.items():
        m.load_state_dict(IdRowMap(name, m.opts).state_dict())  # an empty map: every id on row 0
    assert not np.allclose(score(bare, probe, torch.device("cpu")), trained)


def _gather_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    import os

    import torch.distributed as dist

    from trainers.step import IdGather

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        g = IdGather(Dist(rank=rank, world=world, local_rank=rank, device=torch.device("cpu"), backend="gloo"))
        got = []
        for step in range(3):  # step 1 outgrows the room: a second all-gather at the exact size
            n = 50 if step != 1 else 400 * (rank + 1)
            ids = np.unique(np.arange(n) * (rank + 2))
            mine = {"item_id": (ids, np.full(len(ids), rank + 1)), "user_id": (np.array([7, 2**62 + rank]), np.array([1, 2]))}
            got.append(g(mine, newest=1000 * step + rank))
        torch.save(got, Path(out_dir) / f"gather-{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_every_rank_gets_every_ranks_ids_merged(tmp_path: Path) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_gather_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    r0, r1 = (torch.load(tmp_path / f"gather-{r}.pt", weights_only=False) for r in range(2))
    for step, ((m0, n0), (m1, n1)) in enumerate(zip(r0, r1)):
        assert n0 == n1 == 1000 * step + 1  # the newest event time of any rank
        for t in ("item_id", "user_id"):
            assert np.array_equal(m0[t][0], m1[t][0]) and np.array_equal(m0[t][1], m1[t][1])
        n = 50 if step != 1 else None
        a = np.unique(np.arange(n or 400) * 2)
        b = np.unique(np.arange(n or 800) * 3)
        want = {i: 0 for i in np.union1d(a, b).tolist()}
        for i in a.tolist():
            want[i] += 1
        for i in b.tolist():
            want[i] += 2
        assert m0["item_id"][0].tolist() == sorted(want) and m0["item_id"][1].tolist() == [want[i] for i in sorted(want)]
        assert m0["user_id"][0].tolist() == [7, 2**62, 2**62 + 1] and m0["user_id"][1].tolist() == [2, 2, 2]
