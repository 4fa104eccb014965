"""The registry of what a checkpoint holds: `name -> (piece, where it is stored)`.

Every resumable part of a run is a piece with `state_dict()` / `load_state_dict(state)` (torch's
`Stateful` protocol), registered once under a name and a place:

- `meta`: small and global (the run's counters and positions, its lineage, the drift gauge, early
  stopping, the stream profile). Every rank computes it in registration order (a piece may run a
  collective in `state_dict`, e.g. to sum counters), rank 0 writes it to `meta.json`, and every
  rank loads the same values.
- `model`: tensors (model, optimizer, grad scaler, baselines), written by all ranks together as one
  sharded `torch.distributed.checkpoint` plus rank 0's `model.pt` (`trainers.checkpoint.store`).
- `data`: per rank (cursors, buffered rows, rng states) in `data-rank-R.npz`. A data piece is
  `Resharded`: it loads from *every* old rank's state and takes its own share, so a run resumes
  on another world size without losing or repeating a sample.

The checkpoint code loops over the registry; nothing routes a field by hand. A piece that an
older checkpoint lacks is left as it is (its initial state) when it was registered `optional`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from slipstream.errors import ResumeError

Where = Literal["meta", "model", "data"]
PLACES: tuple[Where, ...] = ("meta", "model", "data")


@runtime_checkable
class Stateful(Protocol):
    """torch's `Stateful`: what a `meta` or `model` piece implements."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Resharded(Protocol):
    """What a `data` piece implements: its state on this rank (None: nothing to save), and the load
    of every old rank's state (None where that rank saved none), of which it takes its share."""

    def state_dict(self) -> dict[str, Any] | None: ...

    def load_rank_states(self, states: Sequence[dict[str, Any] | None]) -> None: ...


@dataclass(frozen=True)
class Piece:
    name: str
    obj: Stateful | Resharded
    where: Where
    optional: bool
    """A checkpoint without this piece loads (older layouts; a piece of a phase not reached)."""


class CheckpointPieces:
    """The pieces of a run in registration order (the order collectives run in, on every rank)."""

    def __init__(self) -> None:
        self._pieces: dict[str, Piece] = {}

    def add(self, name: str, obj: Stateful | Resharded, where: Where, *, optional: bool = False) -> None:
        if name in self._pieces:
            raise ValueError(f"checkpoint piece {name!r} is registered twice")
        if where not in PLACES:
            raise ValueError(f"checkpoint piece {name!r}: where must be one of {', '.join(PLACES)}, got {where!r}")
        expected = Resharded if where == "data" else Stateful
        if not isinstance(obj, expected):
            raise TypeError(f"checkpoint piece {name!r} ({type(obj).__name__}) is not {expected.__name__}")
        self._pieces[name] = Piece(name, obj, where, optional)

    def names(self, where: Where) -> list[str]:
        return [p.name for p in self._pieces.values() if p.where == where]

    def state_dicts(self, where: Where) -> dict[str, Any]:
        """`{name: state}` of the pieces stored in `where` (collective: call it on every rank)."""
        return {p.name: p.obj.state_dict() for p in self._pieces.values() if p.where == where}

    def load(self, where: Where, states: Mapping[str, Any], source: str) -> None:
        """Every `meta` or `model` piece from `states`; `source` names the checkpoint in errors."""
        if where == "data":
            raise ValueError("data pieces load from every old rank's state: use load_data")
        for p in self._pieces.values():
            if p.where != where:
                continue
            if states.get(p.name) is None:
                if p.optional:
                    continue
                raise ResumeError(f"{source} has no {p.name!r} state: it is damaged, or was written by another "
                                  "Slipstream version; resume with that version, or start a new run.run_id")
            obj = p.obj
            assert isinstance(obj, Stateful)  # `add` checked it: a meta or model piece
            obj.load_state_dict(states[p.name])

    def load_data(self, per_rank: Sequence[Mapping[str, Any]]) -> None:
        """Every `data` piece from the states every old rank saved (a piece takes its own share)."""
        for p in self._pieces.values():
            if p.where == "data":
                obj = p.obj
                assert isinstance(obj, Resharded)  # `add` checked it: a data piece
                obj.load_rank_states([s.get(p.name) for s in per_rank])
