"""Turning checkpointed data progress back into the sources' state, including across world sizes.

Batch phase: the sample order of an epoch depends on the world size, so a checkpoint taken
mid-epoch resumes only on the same world size (and rank r takes rank r's cursor). At an epoch
boundary every cursor is (next epoch, 0, 0) and any world size can continue.
Stream phase: progress is per Kafka partition (positions) plus rows buffered but not trained;
a new world size re-deals partitions and every buffered row goes to the rank that now owns its
partition, so nothing is lost or trained twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from slipstream.errors import ResumeError
from trainers.rows import Rows, rows_from_state


@dataclass
class ResumePoint:
    step: int = 0
    phase: str = "batch"
    epoch: int = 0
    chunk: int = 0
    offset: int = 0
    iceberg_state: dict[str, Any] | None = None
    positions: dict[int, int] = field(default_factory=dict)
    handoff_offsets: dict[int, int] | None = None
    handoff_methods: dict[int, str] = field(default_factory=dict)
    stream_rows: Rows | None = None
    stream_rng: dict[str, Any] | None = None
    replay_rows: Rows | None = None
    replay_keys: np.ndarray | None = None
    replay_rng: dict[str, Any] | None = None
    counters: dict[str, float] = field(default_factory=dict)
    profile: dict[str, Any] | None = None
    stream_elapsed_s: float = 0.0


def _int_keys(d: dict[Any, Any] | None) -> dict[int, Any] | None:
    return None if d is None else {int(k): v for k, v in d.items()}


def resume_point(meta: dict[str, Any], states: list[dict[str, Any]], rank: int, world: int,
                 my_partitions: list[int] | None) -> ResumePoint:
    """This rank's resume point from the checkpoint meta and every old rank's data state."""
    old_world = int(meta["world"])
    if len(states) != old_world:
        raise ResumeError(f"checkpoint has {len(states)} rank states but says world={old_world}: it is damaged")
    rp = ResumePoint(step=int(meta["step"]), phase=meta["phase"], epoch=int(meta["epoch"]),
                     positions=_int_keys(meta.get("positions")) or {},
                     handoff_offsets=_int_keys(meta.get("handoff_offsets")),
                     handoff_methods=_int_keys(meta.get("handoff_methods")) or {},
                     counters=dict(meta.get("counters", {})) if rank == 0 else {},
                     profile=meta.get("profile") if rank == 0 else None,
                     stream_elapsed_s=float(meta.get("stream_elapsed_s", 0.0)))
    if rp.phase == "batch":
        at_boundary = all(s["iceberg"]["chunk"] == 0 and s["iceberg"]["offset"] == 0 for s in states)
        if old_world != world and not at_boundary:
            raise ResumeError(
                f"the checkpoint at step {rp.step} is in the middle of batch epoch {rp.epoch} with "
                f"{old_world} ranks; this run has {world}. The batch phase's sample order depends on the "
                f"world size, so resuming would lose or repeat samples: resume with --nproc-per-node {old_world} "
                "(a different size is accepted at an epoch boundary and in the stream phase)."
            )
        if old_world == world:
            mine = states[rank]["iceberg"]
            rp.iceberg_state = mine
            rp.chunk, rp.offset = int(mine["chunk"]), int(mine["offset"])
    old_ranks = [r for r in range(old_world) if r % world == rank]
    replay = [rows_from_state(states[r]["replay"]["rows"]) for r in old_ranks if states[r].get("replay")]
    if replay:
        rp.replay_rows = Rows.concat(replay)
        rp.replay_keys = np.concatenate([states[r]["replay"]["keys"] for r in old_ranks if states[r].get("replay")])
        if old_world == world:
            rp.replay_rng = states[rank]["replay"]["rng"]
    if rp.phase != "batch" and my_partitions is not None:
        parts = set(my_partitions)
        buffered = []
        for s in states:
            if s.get("shuffle"):
                rows = rows_from_state(s["shuffle"]["rows"])
                buffered.append(rows.mask(np.isin(rows.partition, list(parts))) if len(rows) else rows)
        rp.stream_rows = Rows.concat(buffered) if buffered else None
        if old_world == world and states[rank].get("shuffle"):
            rp.stream_rng = states[rank]["shuffle"]["rng"]
    return rp
