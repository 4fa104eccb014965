"""The id -> row map of a managed table: collisionless, bounded by `rows`, admission after N
occurrences, lru / lfu / ttl eviction, and the same map again after a restore."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from slipstream.samples.spec import TableOptions
from trainers.models.managed import EMPTY, EVICT_SHARE, IdRowMap


def _step(m: IdRowMap, ids: np.ndarray, now_us: int = 0):  # type: ignore[no-untyped-def]
    u, c = torch.unique(torch.from_numpy(ids), return_counts=True)
    return m.observe(u, c, now_us)


def _stream(seed: int, steps: int, batch: int, space: int) -> list[np.ndarray]:
    """Zipf-distributed 64-bit ids (negative ones too), a step of `batch` occurrences at a time."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(-(2**62), 2**62, space)
    p = 1.0 / np.arange(1, space + 1) ** 1.1
    return [ids[rng.choice(space, batch, p=p / p.sum())] for _ in range(steps)]


class Reference:
    """The documented policy in plain Python: exact counts, dict lookups."""

    def __init__(self, rows: int, eviction: str) -> None:
        self.rows, self.eviction = rows, eviction
        self.row_id: list[int | None] = [None] * rows
        self.last = [0] * rows
        self.hits = [0] * rows
        self.clock = 0

    def observe(self, ids: np.ndarray) -> None:
        u, c = np.unique(ids, return_counts=True)
        self.clock += 1
        where = {i: r for r, i in enumerate(self.row_id) if i is not None}
        new = []
        for i, n in zip(u.tolist(), c.tolist()):
            if i in where:
                self.last[where[i]] = self.clock
                self.hits[where[i]] += n
            else:
                new.append((-n, i))
        free = [r for r in range(1, self.rows) if self.row_id[r] is None]
        # rows short: the most occurrences first, then the smaller id; else in the order of the ids
        new.sort(key=(lambda x: x) if len(free) < len(new) else (lambda x: x[1]))
        if len(free) < len(new):
            score = self.last if self.eviction == "lru" else self.hits
            evictable = sorted((score[r], r) for r in range(1, self.rows)
                               if self.row_id[r] is not None and self.last[r] != self.clock)
            k = min(len(evictable), max(len(new) - len(free), int(self.rows * EVICT_SHARE)))
            victims = sorted(r for _, r in evictable[:k])
            for r in victims:
                self.row_id[r] = None
            free += victims
        for r, (negn, i) in zip(free, new):
            self.row_id[r], self.last[r], self.hits[r] = i, self.clock, -negn


def _check_collisionless(m: IdRowMap) -> None:
    held = m.row_ids[m.row_ids != EMPTY]
    assert len(torch.unique(held)) == len(held)  # no id holds two rows
    assert m.row_ids[0] == EMPTY  # row 0 is everyone's who has no row
    rows = m.lookup(m.row_ids[1:])
    used = m.row_ids[1:] != EMPTY
    assert torch.equal(rows[used], torch.arange(1, m.rows)[used])  # every admitted id finds its own row


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_the_map_is_collisionless_bounded_and_follows_its_policy_exactly(eviction: str) -> None:
    rows = 150
    m, ref = IdRowMap("t", TableOptions(rows=rows, eviction=eviction)), Reference(rows, eviction)
    sizes = {k: v.numel() for k, v in m.state_dict().items()}
    stream = _stream(seed=1, steps=60, batch=48, space=20 * rows)
    for ids in stream:
        _step(m, ids)
        ref.observe(ids)
        _check_collisionless(m)
        assert m.row_ids.tolist() == [EMPTY if i is None else i for i in ref.row_id]
    assert {k: v.numel() for k, v in m.state_dict().items()} == sizes  # memory fixed by rows
    s = m.stats()
    assert s["rows_in_use"] == rows - 1 and s["evicted"] > 0 and s["admitted"] == s["rows_in_use"] + s["evicted"]
    # ids without a row of their own are looked up as row 0, and nothing else is
    never = torch.tensor([12345, -7, 2**62 + 3])
    assert m.lookup(never).tolist() == [0, 0, 0]


def test_an_id_gets_its_row_after_admit_after_earlier_occurrences() -> None:
    m = IdRowMap("t", TableOptions(rows=16, admit_after=2))
    _step(m, np.array([5, 5, 9]))  # 5 seen twice, 9 once: neither has a row yet
    assert m.lookup(torch.tensor([5, 9])).tolist() == [0, 0]
    got = _step(m, np.array([5, 9]))  # 5 has two earlier occurrences: admitted now; 9 has one
    r5 = int(m.lookup(torch.tensor([5]))[0])
    assert r5 > 0 and got.admitted_rows.tolist() == [r5] and m.lookup(torch.tensor([9])).tolist() == [0]
    _step(m, np.array([9]))
    assert int(m.lookup(torch.tensor([9]))[0]) not in (0, r5)
    assert m.stats()["admitted"] == 2


def test_the_admission_sketch_never_counts_below_the_truth() -> None:
    m = IdRowMap("t", TableOptions(rows=64, admit_after=1000))  # nobody is admitted: every id is counted
    truth: dict[int, int] = {}
    for ids in _stream(seed=2, steps=6, batch=100, space=3000):  # 600 occurrences < width: no halving yet
        _step(m, ids)
        for i in ids.tolist():
            truth[i] = truth.get(i, 0) + 1
    ids = torch.tensor(sorted(truth))
    est = torch.from_numpy(m._estimate(m._cells(ids.numpy())))
    assert (est >= torch.tensor([truth[i] for i in ids.tolist()])).all()
    assert float((est > torch.tensor([truth[i] for i in ids.tolist()])).float().mean()) < 0.05  # rarely above


def test_ttl_frees_rows_of_ids_unseen_for_ttl_days_and_never_evicts_a_live_one() -> None:
    day = 86_400 * 1_000_000
    m = IdRowMap("t", TableOptions(rows=4, eviction="ttl", ttl_days=2))
    _step(m, np.array([1, 2, 3]), now_us=0)
    got = _step(m, np.array([4]), now_us=day)  # full, nobody expired: 4 waits on row 0
    assert got.admitted == 0 and m.lookup(torch.tensor([4])).tolist() == [0]
    _step(m, np.array([1]), now_us=int(2.5 * day))  # 2 and 3 unseen for 2.5 days: their rows are freed
    assert m.stats()["expired"] == 2 and m.rows_in_use == 1
    _step(m, np.array([4, 5]), now_us=int(2.6 * day))
    assert sorted(m.lookup(torch.tensor([4, 5])).tolist()) == [2, 3] and m.lookup(torch.tensor([2, 3])).tolist() == [0, 0]


def test_a_restored_map_maps_and_evolves_exactly_as_the_original() -> None:
    opts = TableOptions(rows=100, admit_after=1, eviction="lru")
    stream = _stream(seed=3, steps=40, batch=50, space=3000)
    a = IdRowMap("t", opts)
    for ids in stream[:20]:
        _step(a, ids)
    b = IdRowMap("t", opts)
    b.load_state_dict({k: v.clone() for k, v in a.state_dict().items()})
    for ids in stream[20:]:
        _step(a, ids)
        _step(b, ids)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    probe = torch.from_numpy(np.concatenate(stream))
    assert torch.equal(a.lookup(probe), b.lookup(probe))
