"""Resuming a batch epoch on another world size, mid-epoch (as Mosaic Streaming does).

An epoch's sample order on `world` ranks is fixed by (seed, epoch, rank, world, units): rank r
reads its chunks c = 0, 1, ... and chunk (r, c) is a set of units whose rows are permuted with
`default_rng([seed, epoch, r, c])`. A checkpoint holds each rank's cursor (chunk, offset), so
what is left of the epoch is exact: for every old rank, the rest of its current chunk (skip the
`offset` rows already trained) and its later chunks. Those *pieces* (old rank, chunk, skip) are
dealt round-robin to the new ranks, each re-derived with the old rank's plan and permutation:
every row not yet trained in the epoch is trained once, none twice, whatever the new world.

A rank in a re-dealt epoch checkpoints its own pieces with its cursor; a later resume (same or
another world) re-deals what is left of them again. The next epoch starts normally on the new world.
"""

from __future__ import annotations

from typing import Any, Callable

Piece = tuple[int, int, int]
"""(rank of the plan the chunk belongs to, chunk index in that rank's epoch plan, rows to skip)"""


def remaining_pieces(states: list[dict[str, Any]], n_chunks: Callable[[int, int], int]) -> tuple[int, list[Piece]]:
    """The base world and every piece of the epoch not yet trained, in old-rank order, from the
    old ranks' Iceberg states. `n_chunks(rank, world)` counts the chunks of a rank's epoch plan."""
    bases = {int(s.get("base_world", s["world"])) for s in states}
    if len(bases) != 1:
        raise ValueError(f"rank states disagree on the epoch's plan (worlds {sorted(bases)}): the checkpoint is damaged")
    base = bases.pop()
    pieces: list[Piece] = []
    for s in states:
        at, offset = int(s["chunk"]), int(s["offset"])
        if s.get("pieces") is not None:
            mine = [tuple(int(x) for x in p) for p in s["pieces"]]
        else:
            mine = [(int(s["rank"]), c, 0) for c in range(n_chunks(int(s["rank"]), base))]
        for i, (r, c, skip) in enumerate(mine[at:], start=at):
            pieces.append((r, c, max(skip, offset) if i == at else skip))
    return base, pieces


def deal(pieces: list[Piece], rank: int, world: int) -> list[Piece]:
    """This rank's share of the pieces: round-robin, so each rank gets about the same work."""
    return pieces[rank::world]
