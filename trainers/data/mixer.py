"""The stream phase's batches: a shuffle buffer of fresh rows and the priority mix with replay.

- `StreamShuffle` holds fresh rows until it has `capacity` of them (or the stream is idle) and
  emits random subsets: records of different partitions and times mix within a batch.
- `ReplayReservoir` keeps a uniform sample (random-key top-k, vectorised) of the recent part of
  the batch window; each stream batch draws `replay_share` of its rows from it, so a fresh
  stream of one hour does not wash out what the model learned from days.

- `exchange_split` deals a rank's fresh rows into one piece per rank for `data.exchange` (the
  all-to-all that makes every rank's batch mix all partitions, not only its own).

The shuffle and the reservoir are part of the checkpoint (their rows and RNG state), so a stream-phase resume neither
loses the rows buffered but not yet trained nor replays differently.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainers.rows import SOURCE_REPLAY, Rows, rows_from_state, rows_to_state


class StreamShuffle:
    def __init__(self, capacity: int, seed: int, rank: int) -> None:
        self.capacity = capacity
        self.rng = np.random.default_rng([seed, rank, 17])
        self.rows = Rows.empty()

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: Rows) -> None:
        if len(rows):
            self.rows = Rows.concat([self.rows, rows]) if len(self.rows) else rows

    def take(self, n: int, idle: bool) -> Rows:
        """Up to n random rows once the buffer is full, or whatever is there when idle."""
        have = len(self.rows)
        if have == 0 or (have < self.capacity and not idle):
            return Rows.empty()
        k = min(n, have)
        pick = self.rng.choice(have, size=k, replace=False) if k < have else self.rng.permutation(have)
        rest = np.ones(have, dtype=bool)
        rest[pick] = False
        out = self.rows.take(pick)
        self.rows = self.rows.mask(rest)
        return out

    def state(self) -> dict[str, Any]:
        return {"rows": rows_to_state(self.rows), "rng": self.rng.bit_generator.state}

    def load(self, rows: Rows, rng_state: dict[str, Any] | None) -> None:
        self.rows = rows
        if rng_state is not None:
            self.rng.bit_generator.state = rng_state


class ReplayReservoir:
    def __init__(self, capacity: int, start_us: int, seed: int, rank: int) -> None:
        self.capacity = capacity
        self.start_us = start_us
        self.rng = np.random.default_rng([seed, rank, 29])
        self.rows = Rows.empty()
        self.keys = np.zeros(0)
        self.replayed = 0

    def __len__(self) -> int:
        return len(self.rows)

    def offer(self, rows: Rows) -> None:
        """Keep a uniform sample of the offered rows with event_time >= start_us."""
        recent = rows.mask(rows.event_us >= self.start_us)
        if not len(recent):
            return
        keys = np.concatenate([self.keys, self.rng.random(len(recent))])
        pool = Rows.concat([self.rows, recent]) if len(self.rows) else recent
        if len(pool) > self.capacity:
            keep = np.argpartition(keys, len(keys) - self.capacity)[-self.capacity:]
            pool, keys = pool.take(keep), keys[keep]
        self.rows, self.keys = pool, keys

    def draw(self, n: int) -> Rows:
        if n <= 0 or not len(self.rows):
            return Rows.empty()
        out = self.rows.take(self.rng.integers(0, len(self.rows), n))
        out.source[:] = SOURCE_REPLAY
        self.replayed += n
        return out

    def state(self) -> dict[str, Any]:
        return {"rows": rows_to_state(self.rows), "keys": self.keys, "rng": self.rng.bit_generator.state,
                "replayed": self.replayed}

    def load(self, rows: Rows, keys: np.ndarray, rng_state: dict[str, Any] | None, replayed: int = 0) -> None:
        self.rows, self.keys, self.replayed = rows, keys, replayed
        if rng_state is not None:
            self.rng.bit_generator.state = rng_state


def exchange_split(rows: Rows, world: int, seed: int, rank: int, step: int) -> list[Rows]:
    """Deal `rows` into `world` pieces of sizes differing by at most one, at random.

    The permutation is seeded by (seed, rank, step) and the larger pieces rotate with rank and
    step, so the split is a pure function of its arguments (no state to checkpoint): given the
    same polled rows a resumed run deals them the same way, and over many steps every rank gets
    the same share of every sender's rows."""
    if world <= 1 or not len(rows):
        return [rows] + [Rows.empty() for _ in range(world - 1)]
    rng = np.random.default_rng([seed, rank, step, 53])
    chunks = np.array_split(rng.permutation(len(rows)), world)
    shift = (rank + step) % world
    chunks = chunks[-shift:] + chunks[:-shift] if shift else chunks
    return [rows.take(np.sort(c)) if len(c) else Rows.empty() for c in chunks]


def replay_count(batch_size: int, share: float) -> int:
    return int(round(batch_size * share))


def load_rows(state: dict[str, Any]) -> Rows:
    return rows_from_state(state)
