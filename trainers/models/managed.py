"""Managed embedding tables: every admitted id gets a row of its own, no two ids share one.

A hashed table embeds `id mod rows`: two ids with the same remainder share a vector forever, and in
a long-tailed id space most new ids of the stream land on rows that old, well-trained ids own. A
managed table (`table: managed` in the feature spec) keeps an id -> row map instead:

- **Row 0 is the shared "new id" row.** An id without a row of its own (not admitted yet, or
  evicted) is embedded there, so it learns what an unknown id looks like, not another id's vector.
- **Admission** (`admit_after: N`): an id gets a row at the first step in which it occurs after N
  earlier occurrences (0: at its first). Occurrences of ids without a row are counted in a
  count-min sketch of fixed size (`SKETCH_DEPTH` x a power of two >= 2 x rows), whose counts halve
  every time as many occurrences as it has columns were added: an id must occur N times within
  the recent stream, and a count is never under the truth (an id may be admitted a little early
  when it shares all its counters with others, never late).
- **Eviction** when no row is free: `lru` frees the rows of the least recently seen ids, `lfu` of
  the least often seen ones (a hundredth of the table at a time, never a row seen in the current
  step); `ttl` frees the rows of ids not seen for `ttl_days` of event time and admits no more ids
  than there are free rows.
- A newly admitted id's row starts as a copy of the shared row (what the model knew of the id
  until then) with fresh optimizer state: `trainers.step` writes that, on whatever rank holds the
  row.

The map is module state (buffers) of the model, so whatever carries the weights carries the map
with them: checkpoints, the best epoch, the batch-only snapshot at T, the export and the champion.
Its size is fixed by `rows` (28 bytes a row, the sketch's 12 to 24 with `admit_after`, and the
small `recent` array), whatever the number of distinct ids. Every rank observes the same ids (all
ranks' ids of a step, merged: `trainers.step`) and runs the same integer arithmetic, so all ranks
give a new id the same row at the same step. An id is counted where it is the feature's own value;
the lists and sequences that share the table look it up only.

Lookups search two sorted arrays: `main` (rebuilt from the rows' ids now and then) and a small
`recent` one (ids admitted since); an evicted id's entry is zeroed where it is. A step's cost
follows its ids, not the table: the table is scanned only to evict (once per hundredth of it) and
to rebuild `main` (once per `recent`'s capacity of admissions).

The map's work is a few dozen operations on arrays of the step's ids, so it runs in numpy on views
of the buffers (a numpy operation on a thousand ids costs a tenth of a torch one here), and the
buffers stay on the CPU whatever the model's device: a GPU model's lookup moves the ids to the
CPU and the rows back (docs/models.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from slipstream.samples.spec import Spec, TableOptions

EMPTY = np.iinfo(np.int64).max
"""A free row's id, and the padding of the sorted arrays (an id equal to it is never admitted)."""
SKETCH_DEPTH = 3
US_PER_DAY = 86_400 * 1_000_000
EVICT_SHARE = 0.01
"""When a full lru/lfu table needs rows, at least this share of it is freed at once."""
_C = ("clock", "now_us", "admitted", "evicted", "expired", "sketch_mass", "swept_us", "recent_used", "in_use")
"""The map's counters (one int64 buffer): steps observed, newest event time, ids admitted, ids
evicted (lru/lfu), ids expired (ttl), occurrences in the sketch since it last halved, event time of
the last ttl sweep, entries of `recent`, rows held by an id."""
_GOLDEN, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray, seed: int) -> np.ndarray:
    """SplitMix64's finalizer (uint64, wrapping) of int64 ids: a well-spread hash of every id."""
    with np.errstate(over="ignore"):
        z = x.view(np.uint64) + np.uint64(seed + 1) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def _ints(x: Any) -> np.ndarray:
    """int64 numpy ids from a numpy array or a (CPU or device) tensor."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(x, dtype=np.int64)


@dataclass(frozen=True)
class Observed:
    """What one step's observation changed."""

    admitted_rows: np.ndarray
    """Rows that a new id took this step (their vectors and optimizer state start afresh)."""
    admitted: int
    evicted: int
    expired: int


class IdRowMap(nn.Module):
    """One managed table's id -> row map (`TableOptions`), as buffers of fixed size on the CPU."""

    row_ids: torch.Tensor
    """(rows,) the id each row holds (EMPTY: free; row 0 always)."""
    score: torch.Tensor
    """(rows,) what eviction goes by: lru, the map's clock (steps observed) when the row's id was
    last seen; lfu, the id's occurrences since it was admitted; ttl, the newest event time of the
    step in which it was last seen."""
    main_keys: torch.Tensor
    main_rows: torch.Tensor
    recent_keys: torch.Tensor
    recent_rows: torch.Tensor
    sketch: torch.Tensor
    counters: torch.Tensor

    def __init__(self, name: str, opts: TableOptions) -> None:
        super().__init__()
        if opts.rows < 2:
            raise ValueError(f"managed table {name}: rows must be >= 2 (row 0 is shared), got {opts.rows}")
        self.name, self.opts, self.rows = name, opts, opts.rows
        self.ttl_us = int(opts.ttl_days * US_PER_DAY) if opts.ttl_days is not None else 0
        self.recent_cap = int(min(opts.rows - 1, max(1024, 16 * math.isqrt(opts.rows))))
        width = 1 << max(10, (2 * opts.rows - 1).bit_length()) if opts.admit_after > 0 else 0
        full = lambda n, v: torch.full((n,), v, dtype=torch.int64)  # noqa: E731
        self.register_buffer("row_ids", full(opts.rows, EMPTY))
        self.register_buffer("score", full(opts.rows, 0))
        self.register_buffer("main_keys", full(opts.rows - 1, EMPTY))
        self.register_buffer("main_rows", torch.zeros(opts.rows - 1, dtype=torch.int32))
        self.register_buffer("recent_keys", full(self.recent_cap, EMPTY))
        self.register_buffer("recent_rows", torch.zeros(self.recent_cap, dtype=torch.int32))
        self.register_buffer("sketch", torch.zeros((SKETCH_DEPTH, width), dtype=torch.int32))
        self.register_buffer("counters", full(len(_C), 0))

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> IdRowMap:
        # the map stays on the CPU (its work is numpy on views of these buffers): a model moved to
        # a GPU keeps its maps here, and a lookup moves ids over and rows back
        return self

    def _np(self, name: str) -> np.ndarray:
        """A numpy view of a buffer (shared memory: writes go to the buffer), cached while the
        buffers are the same tensors (`load_state_dict` copies into them)."""
        bufs = self._buffers
        key = (id(bufs["row_ids"]), id(bufs["counters"]))
        if getattr(self, "_views_key", None) != key:
            self._views = {n: t.numpy() for n, t in bufs.items() if t is not None}
            self._views_key = key
        return self._views[name]

    # --- reading ----------------------------------------------------------------------------
    def counter(self, name: str) -> int:
        return int(self._np("counters")[_C.index(name)])

    @property
    def rows_in_use(self) -> int:
        return int((self._np("row_ids") != EMPTY).sum())

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Each id's row (a tensor like `ids`, on its device): its own when admitted, else 0. Reads
        only: scoring and serving use it."""
        return torch.from_numpy(self.rows_of(_ints(ids))).to(ids.device)

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        # an admitted id has its row in exactly one of the two arrays (the other answers 0)
        return (_find(self._np("main_keys"), self._np("main_rows"), ids)
                + _find(self._np("recent_keys"), self._np("recent_rows"), ids)).astype(np.int64)

    def ids_with_rows(self) -> np.ndarray:
        """The admitted ids, sorted."""
        ids = self._np("row_ids")
        return np.sort(ids[ids != EMPTY])

    # --- the step's update ------------------------------------------------------------------
    def observe(self, ids: Any, counts: Any, now_us: int) -> Observed:
        """One step's ids (unique, sorted, all ranks') with their occurrences; `now_us`: the step's
        newest event time. Updates recency and frequency, admits and evicts."""
        ids, counts = _ints(ids), _ints(counts)
        if ids.size == 0:
            return Observed(np.zeros(0, dtype=np.int64), 0, 0, 0)
        row_ids, score = self._np("row_ids"), self._np("score")
        c = dict(zip(_C, self._np("counters").tolist()))
        c["clock"] += 1
        c["now_us"] = max(c["now_us"], int(now_us))
        clock, now = c["clock"], c["now_us"]
        rows = self.rows_of(ids)
        held = rows > 0
        seen = rows[held]
        if self.opts.eviction == "lfu":
            score[seen] += counts[held]
        else:
            score[seen] = clock if self.opts.eviction == "lru" else now
        fresh = ~held & (ids != EMPTY)
        new_ids, new_counts = ids[fresh], counts[fresh]
        expired = self._sweep(now, c) if self.ttl_us else 0
        if self.opts.admit_after > 0 and new_ids.size:
            cells = self._cells(new_ids)
            ready = self._estimate(cells) >= self.opts.admit_after
            self._count(cells[:, ~ready], new_counts[~ready], c)
            new_ids, new_counts = new_ids[ready], new_counts[ready]
        admitted, evicted, got = 0, 0, np.zeros(0, dtype=np.int64)
        if new_ids.size:
            free = (np.flatnonzero(row_ids[1:] == EMPTY) + 1 if c["in_use"] < self.rows - 1
                    else np.zeros(0, dtype=np.int64))
            if free.size < new_ids.size:  # rows are short: the most occurrences this step first, then the smaller id
                order = np.argsort(-new_counts, kind="stable")
                new_ids, new_counts = new_ids[order], new_counts[order]
            if free.size < new_ids.size and self.opts.eviction in ("lru", "lfu"):
                victims = self._victims(new_ids.size - free.size, seen)
                evicted = int(victims.size)
                self._free(victims)
                free = np.concatenate([free, victims])
            admitted = min(free.size, new_ids.size)
            got, new_ids, new_counts = free[:admitted], new_ids[:admitted], new_counts[:admitted]
            row_ids[got] = new_ids
            score[got] = new_counts if self.opts.eviction == "lfu" else (clock if self.opts.eviction == "lru" else now)
            self._remember(new_ids, got, c)
        c["admitted"] += admitted
        c["evicted"] += evicted
        c["in_use"] += admitted - evicted
        self._np("counters")[:] = [c[k] for k in _C]
        return Observed(got, admitted, evicted, expired)

    def _victims(self, need: int, seen: np.ndarray) -> np.ndarray:
        """Rows to free for `need` new ids (at least EVICT_SHARE of the table): the least recently
        (lru) or least often (lfu) seen, never one `seen` this step; ties go to the lower row."""
        # one key per row, so the choice is the same on every rank (score * rows + row)
        key = self._np("score") * self.rows + np.arange(self.rows)
        key[self._np("row_ids") == EMPTY] = EMPTY
        key[seen] = EMPTY
        key[0] = EMPTY
        evictable = int((key != EMPTY).sum())
        k = min(evictable, max(need, int(self.rows * EVICT_SHARE)))
        if k == 0:
            return np.zeros(0, dtype=np.int64)
        return np.sort(np.argpartition(key, k - 1)[:k])

    def _free(self, rows: np.ndarray) -> None:
        """Take rows from their ids: the ids' entries in `main` and `recent` now answer row 0."""
        row_ids = self._np("row_ids")
        ids = row_ids[rows]
        for keys, where in ((self._np("main_keys"), self._np("main_rows")), (self._np("recent_keys"), self._np("recent_rows"))):
            pos = np.minimum(np.searchsorted(keys, ids), keys.size - 1)
            where[pos[keys[pos] == ids]] = 0
        row_ids[rows] = EMPTY

    def _sweep(self, now: int, c: dict[str, int]) -> int:
        """ttl: free the rows of ids not seen for ttl_days (a sweep per 1/64 of the ttl of event time)."""
        if now - c["swept_us"] < max(1, self.ttl_us // 64):
            return 0
        c["swept_us"] = now
        old = (self._np("row_ids") != EMPTY) & (self._np("score") < now - self.ttl_us)
        old[0] = False
        rows = np.flatnonzero(old)
        if rows.size:
            self._free(rows)
            c["expired"] += int(rows.size)
            c["in_use"] -= int(rows.size)
        return int(rows.size)

    def _remember(self, ids: np.ndarray, rows: np.ndarray, c: dict[str, int]) -> None:
        """Make new (id, row) entries findable: into `recent`, or rebuild `main` when it is full."""
        used = c["recent_used"]
        rk, rr = self._np("recent_keys"), self._np("recent_rows")
        live = rr[:used] > 0  # entries of ids evicted since answer 0: drop them
        order = np.argsort(ids)
        keys, where = np.concatenate([rk[:used][live], ids[order]]), np.concatenate([rr[:used][live], rows[order]])
        if keys.size > self.recent_cap:
            self._rebuild_main(c)
            return
        order = np.argsort(keys, kind="stable")  # two sorted runs: a merge
        rk[: keys.size] = keys[order]
        rr[: keys.size] = where[order]
        rk[keys.size: used] = EMPTY  # (entries dropped above leave padding behind)
        rr[keys.size: used] = 0
        c["recent_used"] = int(keys.size)

    def _rebuild_main(self, c: dict[str, int]) -> None:
        ids = self._np("row_ids")[1:]
        order = np.argsort(ids, kind="stable")
        keys = ids[order]
        self._np("main_keys")[:] = keys
        self._np("main_rows")[:] = (order + 1) * (keys != EMPTY)  # (int32: rows < 2**31)
        self._np("recent_keys")[:] = EMPTY
        self._np("recent_rows")[:] = 0
        c["recent_used"] = 0

    # --- the admission sketch ---------------------------------------------------------------
    def _cells(self, ids: np.ndarray) -> np.ndarray:
        """(SKETCH_DEPTH, n) flat indices of each id's counters: lo + d * hi, the two 32-bit halves
        of one 64-bit hash (double hashing), in row d of the sketch."""
        width = self._np("sketch").shape[1]
        h = mix64(ids, 0)
        lo, hi = (h & np.uint64(0xFFFFFFFF)).astype(np.int64), (h >> np.uint64(32)).astype(np.int64) | 1
        d = np.arange(SKETCH_DEPTH, dtype=np.int64)[:, None]
        return ((lo + d * hi) & (width - 1)) + d * width

    def _estimate(self, cells: np.ndarray) -> np.ndarray:
        return self._np("sketch").ravel()[cells].min(axis=0).astype(np.int64)

    def _count(self, cells: np.ndarray, counts: np.ndarray, c: dict[str, int]) -> None:
        if counts.size == 0:
            return
        sketch = self._np("sketch")
        np.add.at(sketch.ravel(), cells.ravel(), np.tile(counts.astype(np.int32), SKETCH_DEPTH))
        c["sketch_mass"] += int(counts.sum())
        if c["sketch_mass"] >= sketch.shape[1]:  # forget slowly: what counts is the recent stream
            sketch //= 2
            c["sketch_mass"] = 0

    def stats(self) -> dict[str, int]:
        """Counts for the run's report."""
        return {"rows": self.rows, "rows_in_use": self.rows_in_use, "admitted": self.counter("admitted"),
                "evicted": self.counter("evicted"), "expired": self.counter("expired")}


def _find(keys: np.ndarray, rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
    pos = np.minimum(np.searchsorted(keys, ids), keys.size - 1)
    return rows[pos] * (keys[pos] == ids)


class ManagedIds(nn.Module):
    """The id -> row maps of a spec's managed tables (by table name), and which features look them
    up: each managed id or categorical feature, and the lists and sequences that share its table."""

    def __init__(self, spec: Spec, rows: dict[str, int]) -> None:
        super().__init__()
        self.maps = nn.ModuleDict()
        for f in spec.sparse:
            if f.managed is not None:
                opts = f.managed if rows.get(f.name, f.managed.rows) == f.managed.rows else \
                    TableOptions(rows[f.name], f.managed.admit_after, f.managed.eviction, f.managed.ttl_days)
                self.maps[f.name] = IdRowMap(f.name, opts)
        self.table_of = {f.name: spec.table_of(f) for f in (*spec.sparse, *spec.lists) if spec.table_of(f) in self.maps}
        """Feature -> its managed table, for every feature that looks one up."""

    def __bool__(self) -> bool:
        return len(self.maps) > 0

    def map(self, table: str) -> IdRowMap:
        """The map of a managed table (typed: a ModuleDict hands back Modules)."""
        return cast(IdRowMap, self.maps[table])

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: self.map(name).stats() for name in self.maps}
