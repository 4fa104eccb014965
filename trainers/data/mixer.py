"""The stream phase's batches: a shuffle buffer of fresh rows and the priority mix with replay.

- `StreamShuffle` holds fresh rows until it has `capacity` of them (or the stream is idle) and
  emits random subsets: records of different partitions and times mix within a batch.
- `ReplayReservoir` keeps a uniform sample (random-key top-k, vectorised) of the recent part of
  the rows the batch phase trained; each stream batch draws `replay_share` of its rows from it, so
  a fresh stream of one hour does not wash out what the model learned from days. It refuses rows
  at or after its end (the validation days): an evaluation row is never replayed.

- `exchange_split` deals a rank's fresh rows into one piece per rank for `data.exchange` (the
  all-to-all that makes every rank's batch mix all partitions, not only its own).

The shuffle and the reservoir are part of the checkpoint (`state_dict`: their rows and RNG state), so
a stream-phase resume neither loses the rows buffered but not yet trained nor replays differently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from slipstream.errors import ResumeError
from trainers.checkpoint.stateful import check_version
from trainers.data.rows import DEFAULT_LAYOUT, SOURCE_REPLAY, RowLayout, Rows, rows_from_state, rows_to_state

STATE_VERSION = 1


class StreamShuffle:
    def __init__(self, capacity: int, seed: int, rank: int, layout: RowLayout = DEFAULT_LAYOUT, world: int = 1) -> None:
        self.capacity = capacity
        self.layout = layout
        self.rank, self.world = rank, world
        self.rng = np.random.default_rng([seed, rank, 17])
        self.rows = Rows.empty(layout)
        self.partitions: list[int] | None = None
        """The Kafka partitions this rank reads (set before a stream-phase resume: the buffered rows
        of these partitions are this rank's, whichever old rank buffered them)."""

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: Rows) -> None:
        if len(rows):
            self.rows = Rows.concat([self.rows, rows]) if len(self.rows) else rows

    def take(self, n: int, idle: bool) -> Rows:
        """Up to n random rows once the buffer is full, or whatever is there when idle."""
        have = len(self.rows)
        if have == 0 or (have < self.capacity and not idle):
            return Rows.empty(self.layout)
        k = min(n, have)
        pick = self.rng.choice(have, size=k, replace=False) if k < have else self.rng.permutation(have)
        rest = np.ones(have, dtype=bool)
        rest[pick] = False
        out = self.rows.take(pick)
        self.rows = self.rows.mask(rest)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "rows": rows_to_state(self.rows), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The buffered rows (every row not yet trained: none may be lost) and, on the same world
        size, the RNG (`rng` None: a re-dealt buffer, mixed with this rank's own seed)."""
        check_version("stream shuffle", state, STATE_VERSION)
        self.rows = _rows("stream shuffle", state)
        if state.get("rng") is not None:
            self.rng.bit_generator.state = state["rng"]

    def load_rank_states(self, states: Sequence[dict[str, Any] | None]) -> None:
        """Every old rank's buffer: this rank takes the rows of the partitions it now reads, and its
        old self's RNG on the same world size (a checkpoint piece, `trainers.checkpoint.pieces`)."""
        buffered = []
        for s in states:
            if s is None:
                continue
            check_version("stream shuffle", s, STATE_VERSION)
            rows = _rows("stream shuffle", s)
            if len(rows) and self.partitions is None:
                raise ResumeError("the checkpoint's stream buffer holds rows but this rank reads no partitions yet: "
                                  "it is damaged (rows buffered before the handoff)")
            buffered.append(rows.mask(np.isin(rows.partition, list(self.partitions or []))) if len(rows) else rows)
        same = len(states) == self.world and states[self.rank] is not None
        self.load_state_dict({"version": STATE_VERSION, "rows": rows_to_state(Rows.concat(buffered)) if buffered
                              else rows_to_state(Rows.empty(self.layout)),
                              "rng": states[self.rank]["rng"] if same else None})  # type: ignore[index]


class ReplayReservoir:
    """A uniform sample of at most `capacity` of the offered rows with start_us <= event_time < end_us:
    every offered row gets a random key and the rows with the largest keys are kept. Offers are
    amortised O(rows offered): once the sample is full a row enters only if its key beats the
    smallest kept one, and new rows are merged in (kept rows ordered by key, largest first) when
    the pending ones reach the capacity, not at every offer. Merging the whole sample at every
    step cost a quarter of the batch phase's last epoch on a 250k-row day (docs/benchmarks.md,
    Scale). The sample and its order depend only on the rows offered and the seed."""

    def __init__(self, capacity: int, start_us: int, seed: int, rank: int, layout: RowLayout = DEFAULT_LAYOUT,
                 world: int = 1, end_us: int | None = None) -> None:
        self.capacity = capacity
        self.start_us = start_us
        self.end_us = end_us if end_us is not None else np.iinfo(np.int64).max
        """Rows at or after this (the validation days before T) never enter."""
        self.layout = layout
        self.rank, self.world = rank, world
        self.rng = np.random.default_rng([seed, rank, 29])
        self._rows = Rows.empty(layout)
        self._keys = np.zeros(0)
        self._pending: list[tuple[Rows, np.ndarray]] = []
        self._pending_n = 0
        self._floor = -1.0
        """The smallest kept key once the sample is full: an offered row below it cannot enter."""
        self.replayed = 0

    def __len__(self) -> int:
        self._merge()
        return len(self._rows)

    @property
    def rows(self) -> Rows:
        self._merge()
        return self._rows

    @property
    def keys(self) -> np.ndarray:
        self._merge()
        return self._keys

    def offer(self, rows: Rows) -> None:
        """Keep a uniform sample of the offered rows with start_us <= event_time < end_us."""
        recent = rows.mask((rows.event_us >= self.start_us) & (rows.event_us < self.end_us))
        if not len(recent):
            return
        keys = self.rng.random(len(recent))
        enter = keys > self._floor
        if not enter.any():
            return
        self._pending.append((recent.mask(enter), keys[enter]))
        self._pending_n += int(enter.sum())
        if self._pending_n >= self.capacity:
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        pool = Rows.concat([self._rows, *(r for r, _ in self._pending)])
        keys = np.concatenate([self._keys, *(k for _, k in self._pending)])
        self._pending, self._pending_n = [], 0
        if len(keys) > self.capacity:
            keep = np.argpartition(keys, len(keys) - self.capacity)[-self.capacity:]
        else:
            keep = np.arange(len(keys))
        order = keep[np.argsort(-keys[keep], kind="stable")]
        self._rows, self._keys = pool.take(order), keys[order]
        if len(self._keys) >= self.capacity:
            self._floor = float(self._keys[-1])

    def draw(self, n: int) -> Rows:
        if n <= 0 or not len(self):
            return Rows.empty(self.layout)
        out = self._rows.take(self.rng.integers(0, len(self._rows), n))
        out.source[:] = SOURCE_REPLAY
        self.replayed += n
        return out

    def state_dict(self) -> dict[str, Any] | None:
        """None while empty (nothing to save: a rank that never offered rows)."""
        if not len(self):
            return None
        return {"version": STATE_VERSION, "rows": rows_to_state(self.rows), "keys": self.keys,
                "rng": self.rng.bit_generator.state, "replayed": self.replayed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The sampled rows with their keys (so later offers keep the sample uniform) and, on the
        same world size, the RNG."""
        check_version("replay reservoir", state, STATE_VERSION)
        rows = _rows("replay reservoir", state)
        keys = np.asarray(state.get("keys", np.zeros(0)))
        if len(keys) != len(rows):
            raise ResumeError(f"the checkpoint's replay reservoir holds {len(rows)} rows but {len(keys)} keys: it is damaged")
        order = np.argsort(-keys, kind="stable")  # (a checkpoint of an older version kept another order)
        self._rows, self._keys, self.replayed = rows.take(order), keys[order], int(state.get("replayed", 0))
        self._pending, self._pending_n = [], 0
        self._floor = float(self._keys[-1]) if len(self._keys) >= self.capacity else -1.0
        if state.get("rng") is not None:
            self.rng.bit_generator.state = state["rng"]

    def load_rank_states(self, states: Sequence[dict[str, Any] | None]) -> None:
        """The samples of the old ranks r with r % world == rank, merged (the RNG only when this rank
        takes over exactly its old self on the same world size)."""
        mine = [s for r, s in enumerate(states) if r % self.world == self.rank and s is not None]
        if not mine:
            return
        for s in mine:
            check_version("replay reservoir", s, STATE_VERSION)
        if len(mine) == 1 and len(states) == self.world:
            self.load_state_dict(mine[0])
            return
        rows = Rows.concat([_rows("replay reservoir", s) for s in mine])
        self.load_state_dict({"version": STATE_VERSION, "rows": rows_to_state(rows), "rng": None, "replayed": 0,
                              "keys": np.concatenate([np.asarray(s.get("keys", np.zeros(0))) for s in mine])})


def _rows(what: str, state: dict[str, Any]) -> Rows:
    try:
        return rows_from_state(state["rows"])
    except (KeyError, TypeError, ValueError) as e:
        raise ResumeError(f"the checkpoint's {what} rows cannot be read ({e}): it is damaged") from None


def exchange_split(rows: Rows, world: int, seed: int, rank: int, step: int) -> list[Rows]:
    """Deal `rows` into `world` pieces of sizes differing by at most one, at random.

    The permutation is seeded by (seed, rank, step) and the larger pieces rotate with rank and
    step, so the split is a pure function of its arguments (no state to checkpoint): given the
    same polled rows a resumed run deals them the same way, and over many steps every rank gets
    the same share of every sender's rows."""
    if world <= 1 or not len(rows):
        return [rows] + [rows.slice(0, 0) for _ in range(world - 1)]
    rng = np.random.default_rng([seed, rank, step, 53])
    chunks = np.array_split(rng.permutation(len(rows)), world)
    shift = (rank + step) % world
    chunks = chunks[-shift:] + chunks[:-shift] if shift else chunks
    return [rows.take(np.sort(c)) if len(c) else rows.slice(0, 0) for c in chunks]


def exchange(rows: Rows, all_to_all: Callable[[list[Any]], list[Any]], world: int, rank: int, seed: int,
             step: int) -> tuple[Rows, int]:
    """Collective: deal `rows` to every rank (`exchange_split`) and return (the rows dealt to this
    rank, how many of ours went to others). Every rank calls it, with no rows too."""
    if world <= 1:
        return rows, 0
    pieces = exchange_split(rows, world, seed, rank, step)
    mine = pieces[rank]
    send: list[Rows | None] = [p if len(p) else None for p in pieces]
    send[rank] = None  # keep our own piece; pickling it to ourselves would be waste
    got = all_to_all(send)
    got[rank] = mine
    parts = [g for g in got if g is not None and len(g)]
    return (Rows.concat(parts) if len(parts) > 1 else (parts[0] if parts else rows.slice(0, 0))), len(rows) - len(mine)


def replay_count(batch_size: int, share: float) -> int:
    return int(round(batch_size * share))
