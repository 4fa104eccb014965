"""The run's counters and positions (`TrainState`), and a checkpoint turned back into every piece's
state, including across world sizes (`resume_point`).

Batch phase: on the same world size rank r takes rank r's cursor. On another world size
mid-epoch, what every old rank had left of the epoch is re-dealt over the new ranks
(`trainers.data.redeal`); at an epoch boundary every cursor is (next epoch, 0, 0) and any world
size simply continues.
Stream phase: progress is per Kafka partition (positions) plus rows buffered but not trained;
a new world size re-deals partitions and every buffered row goes to the rank that now owns its
partition, so nothing is lost or trained twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from slipstream.errors import ResumeError
from trainers.data.mixer import STATE_VERSION as BUFFER_VERSION
from trainers.data.rows import Rows, rows_from_state, rows_to_state
from trainers.checkpoint.stateful import check_version

STATE_VERSION = 1
COUNTERS = ("samples_iceberg", "samples_kafka", "samples_replay", "dropped_before_t", "dead_letters",
            "holdout_stream", "records_kafka")
PHASES = ("batch", "stream", "done")


def _int_keys(d: Mapping[Any, Any] | None) -> dict[int, Any] | None:
    return None if d is None else {int(k): v for k, v in d.items()}


@dataclass
class TrainState:
    """Where the run is and what it has counted: the part of a checkpoint's meta that is the run's
    own (the pieces' states travel next to it), and what `finish` reports."""

    step: int = 0
    """Optimizer steps taken (all ranks take the same number)."""
    phase: str = "batch"
    """batch | stream | done."""
    epoch: int = 0
    """The batch epoch being trained (== data.epochs once the batch phase is over)."""
    positions: dict[int, int] = field(default_factory=dict)
    """Next Kafka offset per partition: this rank's, every rank's after `Trainer.global_positions`."""
    handoff_offsets: dict[int, int] | None = None
    """Per partition, the first offset of the stream phase (None before the handoff)."""
    handoff_methods: dict[int, str] = field(default_factory=dict)
    """How each handoff offset was found (offsets_for_times, binary search, ...)."""
    my_partitions: list[int] = field(default_factory=list)
    """The partitions this rank reads in the stream phase (not saved: re-dealt on resume)."""
    counters: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in COUNTERS})
    """This rank's sample counts (rank 0 also carries a resumed run's earlier totals)."""
    stream_elapsed_s: float = 0.0
    """Seconds of stream phase so far, across restarts."""
    stop_reason: str = ""
    lag_at_stop: int | None = None
    """Records left unread on the topic when the stream phase stopped (None: no stream phase ran)."""
    last_checkpoint: str = ""

    def state_dict(self, counters: Mapping[str, float] | None = None) -> dict[str, Any]:
        """The meta keys of this state; `counters`: the all-ranks totals to record instead of this rank's."""
        return {
            "version": STATE_VERSION, "step": self.step, "phase": self.phase, "epoch": self.epoch,
            "positions": dict(self.positions), "handoff_offsets": self.handoff_offsets,
            "handoff_methods": self.handoff_methods, "counters": dict(counters if counters is not None else self.counters),
            "stream_elapsed_s": self.stream_elapsed_s,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version("run", state, STATE_VERSION)
        if state.get("phase") not in PHASES:
            raise ResumeError(f"the checkpoint's phase is {state.get('phase')!r}, not one of {', '.join(PHASES)}: it is damaged")
        self.step, self.phase, self.epoch = int(state["step"]), str(state["phase"]), int(state["epoch"])
        self.positions = _int_keys(state.get("positions")) or {}
        self.handoff_offsets = _int_keys(state.get("handoff_offsets"))
        self.handoff_methods = _int_keys(state.get("handoff_methods")) or {}
        self.counters = {k: float(state.get("counters", {}).get(k, 0.0)) for k in COUNTERS}
        self.stream_elapsed_s = float(state.get("stream_elapsed_s", 0.0))


@dataclass
class Throughput:
    """What this process measured (not saved: a resumed run measures its own part)."""

    train_s: float = 0.0
    """Seconds in training steps, data waits included."""
    wait_s: float = 0.0
    """Seconds waiting for data (the batch reader, the broker)."""
    trained_global: int = 0
    """Samples trained by all ranks in this process's steps."""
    exchange_s: float = 0.0
    exchanged_rows: int = 0
    latencies_ms: list[np.ndarray] = field(default_factory=list)
    """Consume-to-train latency of stream rows (rank 0, capped)."""


@dataclass
class ResumePoint:
    """This rank's share of a checkpoint: the run's state and each piece's `load_state_dict` input."""

    state: TrainState
    iceberg: dict[str, Any] | None = None
    """This rank's Iceberg cursor (same world size), or None: start the epoch at its beginning."""
    shuffle: dict[str, Any] | None = None
    """The stream-phase rows buffered for this rank's partitions (from every old rank)."""
    replay: dict[str, Any] | None = None
    """The replay reservoir of the old ranks this rank takes over."""
    profile: dict[str, Any] | None = None
    """The stream profile so far (rank 0)."""


def resume_point(meta: dict[str, Any], states: list[dict[str, Any]], rank: int, world: int,
                 my_partitions: list[int] | None) -> ResumePoint:
    """This rank's resume point from the checkpoint meta and every old rank's data state."""
    old_world = int(meta["world"])
    if len(states) != old_world:
        raise ResumeError(f"checkpoint has {len(states)} rank states but says world={old_world}: it is damaged")
    state = TrainState()
    state.load_state_dict(meta)
    if rank != 0:
        state.counters = {k: 0.0 for k in COUNTERS}  # totals live on rank 0 so that sums stay right
    rp = ResumePoint(state=state, profile=meta.get("profile") if rank == 0 else None)
    if state.phase == "batch":
        cursors = [s["iceberg"] for s in states]
        at_boundary = all(c["chunk"] == 0 and c["offset"] == 0 and c.get("pieces") is None for c in cursors)
        if old_world == world:
            rp.iceberg = cursors[rank]
        elif not at_boundary:  # mid-epoch on another world size: what is left of the epoch is re-dealt
            rp.iceberg = {"redeal": cursors}
    rp.replay = _replay_share(states, rank, world, old_world)
    if state.phase != "batch" and my_partitions is not None:
        rp.shuffle = _shuffle_share(states, rank, world, old_world, my_partitions)
    return rp


def _replay_share(states: list[dict[str, Any]], rank: int, world: int, old_world: int) -> dict[str, Any] | None:
    """The reservoirs of the old ranks r with r % world == rank, merged (RNG only on the same world size)."""
    mine = [states[r]["replay"] for r in range(old_world) if r % world == rank and states[r].get("replay")]
    if not mine:
        return None
    for s in mine:
        check_version("replay reservoir", s, BUFFER_VERSION)
    if len(mine) == 1 and old_world == world:
        return mine[0]
    rows = Rows.concat([rows_from_state(s["rows"]) for s in mine])
    return {"version": BUFFER_VERSION, "rows": rows_to_state(rows), "keys": np.concatenate([s["keys"] for s in mine]),
            "rng": mine[0]["rng"] if old_world == world else None, "replayed": 0}


def _shuffle_share(states: list[dict[str, Any]], rank: int, world: int, old_world: int,
                   my_partitions: list[int]) -> dict[str, Any] | None:
    """Every old rank's buffered rows of the partitions this rank now reads (RNG only on the same world size)."""
    buffered = []
    for s in states:
        if s.get("shuffle"):
            check_version("stream shuffle", s["shuffle"], BUFFER_VERSION)
            rows = rows_from_state(s["shuffle"]["rows"])
            buffered.append(rows.mask(np.isin(rows.partition, list(my_partitions))) if len(rows) else rows)
    if not buffered:
        return None
    same = old_world == world and states[rank].get("shuffle")
    return {"version": BUFFER_VERSION, "rows": rows_to_state(Rows.concat(buffered)),
            "rng": states[rank]["shuffle"]["rng"] if same else None}
