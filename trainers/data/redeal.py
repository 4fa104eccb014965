"""Resuming a batch epoch on another world size, mid-epoch (as Mosaic Streaming does).

An epoch's sample order on `world` ranks is fixed by (seed, epoch, rank, world, units): rank r
reads its chunks c = 0, 1, ... and chunk (r, c) is a set of unit spans whose rows are permuted with
`default_rng([seed, epoch, r, c])`. A checkpoint holds each rank's cursor (chunk, offset), so
what is left of the epoch is exact: for every old rank, the rest of its current chunk (skip the
`offset` rows already trained) and its later chunks. Those *pieces* (old rank, chunk, skip) are
dealt round-robin to the new ranks, each re-derived with the old rank's plan and permutation:
every row not yet trained in the epoch is trained once, none twice, whatever the new world.

A rank in a re-dealt epoch checkpoints its own pieces with its cursor; a later resume (same or
another world) re-deals what is left of them again. The next epoch starts normally on the new world.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from slipstream.errors import ResumeError
from trainers.data.units import EpochPlan

Piece = tuple[int, int, int]
"""(rank of the plan the chunk belongs to, chunk index in that rank's epoch plan, rows to skip)"""


def remaining_pieces(states: list[dict[str, Any]],
                     n_chunks: Callable[[int, int, int], int]) -> tuple[int, int, list[Piece]]:
    """The epoch, its base world and every piece of it not yet trained, in old-rank order, from
    the old ranks' Iceberg states. `n_chunks(epoch, rank, world)` counts a rank's chunks."""
    epochs = {int(s["epoch"]) for s in states}
    bases = {int(s.get("base_world", s["world"])) for s in states}
    if len(epochs) != 1 or len(bases) != 1:
        raise ResumeError(f"the checkpoint's ranks disagree on the batch epoch ({sorted(epochs)}) or its plan "
                          f"(worlds {sorted(bases)}): it is damaged")
    epoch, base = epochs.pop(), bases.pop()
    pieces: list[Piece] = []
    for s in states:
        at, offset = int(s["chunk"]), int(s["offset"])
        if s.get("pieces") is not None:
            mine = [tuple(int(x) for x in p) for p in s["pieces"]]
        else:
            mine = [(int(s["rank"]), c, 0) for c in range(n_chunks(epoch, int(s["rank"]), base))]
        for i, (r, c, skip) in enumerate(mine[at:], start=at):
            pieces.append((r, c, max(skip, offset) if i == at else skip))
    return epoch, base, pieces


def pieces_plan(plan_of: Callable[[int], EpochPlan], pieces: list[Piece]) -> EpochPlan:
    """The plan whose chunk i is piece i's chunk, from `plan_of(old rank)` (that rank's epoch plan)."""
    plans: dict[int, EpochPlan] = {}
    orders, spans, bounds = [], [], [0]
    for r, c, _ in pieces:
        order, span = (plans[r] if r in plans else plans.setdefault(r, plan_of(r))).chunk(c)
        orders.append(order)
        spans.append(span)
        bounds.append(bounds[-1] + len(order))
    if not orders:
        return EpochPlan(np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.int64), np.zeros(1, dtype=np.int64))
    return EpochPlan(np.concatenate(orders), np.concatenate(spans), np.asarray(bounds, dtype=np.int64))


def deal(pieces: list[Piece], rank: int, world: int) -> list[Piece]:
    """This rank's share of the pieces: round-robin, so each rank gets about the same work."""
    return pieces[rank::world]
