"""The run's progress as checkpoint pieces (`trainers.checkpoint.pieces`), on any world size.

- `RunProgress` (meta `run`): step, phase, epoch, every partition's next offset and the sample
  counters of all ranks (`TrainState`).
- `BatchCursor` (data `iceberg`): where each rank is in the batch epoch. On the same world size
  rank r takes rank r's cursor; on another world size mid-epoch, what every old rank had left of
  the epoch is re-dealt over the new ranks (`trainers.data.redeal`); at an epoch boundary every
  cursor is (next epoch, 0, 0) and any world size simply continues.
- In the stream phase progress is per Kafka partition (positions) plus the rows buffered but not
  trained (`trainers.data.mixer`): a new world size re-deals partitions and every buffered row goes
  to the rank that now owns its partition, so nothing is lost or trained twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from slipstream.errors import ResumeError
from trainers.checkpoint.stateful import check_version

STATE_VERSION = 1
COUNTERS = ("samples_iceberg", "samples_kafka", "samples_replay", "dropped_before_t", "dead_letters",
            "holdout_stream", "forward_tail_stream", "records_kafka", "duplicates")
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
    forward_tail_start_us: int | None = None
    """Stream records with event time at or after this are the forward tail: never trained
    (`trainers.data.forward_tail`; None: the run has no tail). Fixed at the handoff."""
    my_partitions: list[int] = field(default_factory=list)
    """The partitions this rank reads in the stream phase (not saved: re-dealt on resume)."""
    counters: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in COUNTERS})
    """This rank's sample counts (rank 0 also carries a resumed run's earlier totals)."""
    stream_elapsed_s: float = 0.0
    """Seconds of stream phase so far, across restarts."""
    stop_reason: str = ""
    lag_at_stop: int | None = None
    """Records left unread on the topic when the stream phase stopped (None: no stream phase ran)."""
    stop_offsets: dict[int, int] | None = None
    """Per partition, the committed end when the stream phase stopped: the audit counts what was
    committed in [handoff_offsets, stop_offsets) (None: not stopped yet)."""
    last_checkpoint: str = ""

    def state_dict(self, counters: Mapping[str, float] | None = None) -> dict[str, Any]:
        """The meta keys of this state; `counters`: the all-ranks totals to record instead of this rank's."""
        return {
            "version": STATE_VERSION, "step": self.step, "phase": self.phase, "epoch": self.epoch,
            "positions": dict(self.positions), "handoff_offsets": self.handoff_offsets,
            "handoff_methods": self.handoff_methods, "forward_tail_start_us": self.forward_tail_start_us,
            "counters": dict(counters if counters is not None else self.counters),
            "stream_elapsed_s": self.stream_elapsed_s, "stop_offsets": self.stop_offsets,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version("run", state, STATE_VERSION)
        if state.get("phase") not in PHASES:
            raise ResumeError(f"the checkpoint's phase is {state.get('phase')!r}, not one of {', '.join(PHASES)}: it is damaged")
        self.step, self.phase, self.epoch = int(state["step"]), str(state["phase"]), int(state["epoch"])
        self.positions = _int_keys(state.get("positions")) or {}
        self.handoff_offsets = _int_keys(state.get("handoff_offsets"))
        self.handoff_methods = _int_keys(state.get("handoff_methods")) or {}
        tail = state.get("forward_tail_start_us")
        self.forward_tail_start_us = None if tail is None else int(tail)
        self.counters = {k: float(state.get("counters", {}).get(k, 0.0)) for k in COUNTERS}
        self.stream_elapsed_s = float(state.get("stream_elapsed_s", 0.0))
        self.stop_offsets = _int_keys(state.get("stop_offsets"))


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


class Collectives(Protocol):
    """The two collectives the run's progress needs (`trainers.parallel.dist.Dist` has them)."""

    rank: int

    def sum(self, values: list[float]) -> list[float]: ...

    def gather(self, obj: Any) -> list[Any]: ...


class RunProgress:
    """The `run` piece: this rank's `TrainState`, saved with every rank's counters summed and every
    partition's position (collective), loaded with the totals on rank 0 only (sums stay right)."""

    def __init__(self, state: TrainState, d: Collectives) -> None:
        self.state, self.d = state, d

    def global_positions(self) -> dict[int, int]:
        """Collective: every partition's next offset (each rank reports the partitions it reads)."""
        st = self.state
        if st.phase == "batch" or st.handoff_offsets is None:
            return {}
        merged = dict(st.positions)
        for own in self.d.gather({p: st.positions[p] for p in st.my_partitions}):
            merged.update(own)
        st.positions.update(merged)
        return merged

    def state_dict(self) -> dict[str, Any]:
        st = self.state
        totals = self.d.sum([float(st.counters[k]) for k in COUNTERS])
        positions = self.global_positions()
        return {**st.state_dict(counters=dict(zip(COUNTERS, totals, strict=True))),
                "positions": positions or st.handoff_offsets or {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state)
        if self.d.rank != 0:
            self.state.counters = {k: 0.0 for k in COUNTERS}


class BatchCursor:
    """The `iceberg` piece: this rank's cursor in the batch epoch. Saving reads the live source
    (`source`, set while the batch phase runs); a load keeps this rank's share (`resumed`) for the
    next source to start from."""

    def __init__(self, state: TrainState, rank: int, world: int) -> None:
        self.state, self.rank, self.world = state, rank, world
        self.source: Any = None
        """The batch phase's live `IcebergSource` (None outside it)."""
        self.resumed: dict[str, Any] | None = None
        """This rank's cursor from a checkpoint, for the next source's `load_state_dict`."""

    def state_dict(self) -> dict[str, Any]:
        st = self.state
        cursor: dict[str, Any] = self.source.state_dict() if self.source is not None else {}
        if st.phase != "batch" or not cursor or cursor["epoch"] < st.epoch:
            cursor = {**cursor, "epoch": st.epoch, "chunk": 0, "offset": 0}  # an epoch boundary
        return cursor

    def load_rank_states(self, states: Sequence[dict[str, Any] | None]) -> None:
        cursors = [c for c in states if c is not None]
        if len(cursors) != len(states):
            raise ResumeError(f"the checkpoint holds a batch cursor for {len(cursors)} of its {len(states)} ranks: it is damaged")
        at_boundary = all(c["chunk"] == 0 and c["offset"] == 0 and c.get("pieces") is None for c in cursors)
        if len(cursors) == self.world:
            self.resumed = cursors[self.rank]
        elif not at_boundary:  # mid-epoch on another world size: what is left of the epoch is re-dealt
            self.resumed = {"redeal": cursors}
        else:
            self.resumed = None

