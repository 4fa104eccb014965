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
Its size is fixed by `rows` (about 40 bytes a row, plus the sketch's 24), whatever the number of
distinct ids. Every rank observes the same ids (all ranks' ids of a step, merged: `trainers.step`)
and runs the same integer arithmetic, so all ranks give a new id the same row at the same step.

Lookups search two sorted arrays: `main` (rebuilt from the rows' ids now and then) and a small
`recent` one (ids admitted since); an entry counts only while its row still holds that id, so an
eviction is a single write. A step's cost follows its ids, not the table: the table is scanned
only to evict (once per hundredth of it) and to rebuild `main` (once per `recent`'s capacity of
admissions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from slipstream.samples.spec import Spec, TableOptions

EMPTY = torch.iinfo(torch.int64).max
"""A free row's id, and the padding of the sorted arrays (an id equal to it is never admitted)."""
SKETCH_DEPTH = 3
US_PER_DAY = 86_400 * 1_000_000
EVICT_SHARE = 0.01
"""When a full lru/lfu table needs rows, at least this share of it is freed at once."""
_C = ("clock", "now_us", "admitted", "evicted", "expired", "sketch_mass", "swept_us", "recent_used")
"""The map's counters (one int64 buffer): steps observed, newest event time, ids admitted, ids
evicted (lru/lfu), ids expired (ttl), occurrences in the sketch since it last halved, event time of
the last ttl sweep, entries of `recent`."""
_MIX = (0x9E3779B97F4A7C15 - (1 << 64), 0xBF58476D1CE4E5B9 - (1 << 64), 0x94D049BB133111EB - (1 << 64))


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's `>>` is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _signed(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def mix64(x: torch.Tensor, seed: int) -> torch.Tensor:
    """SplitMix64's finalizer on int64 (wrapping arithmetic): a well-spread hash of every id."""
    z = x + _signed((seed + 1) * _MIX[0])
    z = (z ^ _shr(z, 30)) * _MIX[1]
    z = (z ^ _shr(z, 27)) * _MIX[2]
    return z ^ _shr(z, 31)


@dataclass(frozen=True)
class Observed:
    """What one step's observation changed."""

    admitted_rows: torch.Tensor
    """Rows that a new id took this step (their vectors and optimizer state start afresh)."""
    admitted: int
    evicted: int
    expired: int


class IdRowMap(nn.Module):
    """One managed table's id -> row map (`TableOptions`), as buffers of fixed size."""

    row_ids: torch.Tensor
    """(rows,) the id each row holds (EMPTY: free; row 0 always)."""
    last_step: torch.Tensor
    """(rows,) the map's clock (steps observed) when the row's id was last seen."""
    last_us: torch.Tensor
    """(rows,) the newest event time of the step in which the row's id was last seen."""
    hits: torch.Tensor
    """(rows,) occurrences of the row's id since it was admitted."""
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
        self.register_buffer("last_step", full(opts.rows, 0))
        self.register_buffer("last_us", full(opts.rows, 0))
        self.register_buffer("hits", full(opts.rows, 0))
        self.register_buffer("main_keys", full(opts.rows - 1, EMPTY))
        self.register_buffer("main_rows", full(opts.rows - 1, 0))
        self.register_buffer("recent_keys", full(self.recent_cap, EMPTY))
        self.register_buffer("recent_rows", full(self.recent_cap, 0))
        self.register_buffer("sketch", torch.zeros((SKETCH_DEPTH, width), dtype=torch.int32))
        self.register_buffer("counters", full(len(_C), 0))

    # --- reading ----------------------------------------------------------------------------
    def counter(self, name: str) -> int:
        return int(self.counters[_C.index(name)])

    @property
    def rows_in_use(self) -> int:
        return int((self.row_ids != EMPTY).sum())

    @torch.no_grad()
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Each id's row: its own when admitted, else 0. Reads only: scoring and serving use it."""
        ids = ids.contiguous()
        out = self._find(self.main_keys, self.main_rows, ids)
        if self.counter("recent_used"):
            recent = self._find(self.recent_keys, self.recent_rows, ids)
            out = torch.where(out == 0, recent, out)
        return out

    def _find(self, keys: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.searchsorted(keys, ids).clamp_(max=keys.shape[0] - 1)
        row = rows[pos]
        # an entry counts while its row still holds the id (an evicted id's entry goes stale)
        valid = (keys[pos] == ids) & (self.row_ids[row] == ids) & (ids != EMPTY)
        return torch.where(valid, row, torch.zeros_like(row))

    def ids_with_rows(self) -> torch.Tensor:
        """The admitted ids, sorted."""
        ids = self.row_ids[self.row_ids != EMPTY]
        return torch.sort(ids).values

    # --- the step's update ------------------------------------------------------------------
    @torch.no_grad()
    def observe(self, ids: torch.Tensor, counts: torch.Tensor, now_us: int) -> Observed:
        """One step's ids (unique, sorted, all ranks') with their occurrences; `now_us`: the step's
        newest event time. Updates recency and frequency, admits and evicts."""
        dev = self.row_ids.device
        none = torch.zeros(0, dtype=torch.int64, device=dev)
        if ids.numel() == 0:
            return Observed(none, 0, 0, 0)
        ids, counts = ids.to(dev), counts.to(dev)
        c = self.counters
        c[_C.index("clock")] += 1
        c[_C.index("now_us")] = max(self.counter("now_us"), int(now_us))
        clock, now = self.counter("clock"), self.counter("now_us")
        rows = self.lookup(ids)
        held = rows > 0
        seen = rows[held]
        self.last_step[seen] = clock
        self.last_us[seen] = now
        self.hits[seen] += counts[held]
        new_ids, new_counts = ids[~held & (ids != EMPTY)], counts[~held & (ids != EMPTY)]
        expired = self._sweep(now) if self.ttl_us else 0
        if self.opts.admit_after > 0 and new_ids.numel():
            ready = self._sketch_estimate(new_ids) >= self.opts.admit_after
            self._sketch_add(new_ids[~ready], new_counts[~ready])
            new_ids, new_counts = new_ids[ready], new_counts[ready]
        if new_ids.numel() == 0:
            return Observed(none, 0, 0, expired)
        # who gets a row first when rows are short: the most occurrences this step, then the smaller id
        order = torch.sort(-new_counts, stable=True).indices
        new_ids, new_counts = new_ids[order], new_counts[order]
        free = torch.nonzero(self.row_ids == EMPTY).flatten()
        free = free[free > 0]
        evicted = 0
        if free.numel() < new_ids.numel() and self.opts.eviction in ("lru", "lfu"):
            victims = self._victims(new_ids.numel() - free.numel(), clock)
            evicted = int(victims.numel())
            self.row_ids[victims] = EMPTY
            free = torch.cat([free, victims])
        take = min(free.numel(), new_ids.numel())
        got, new_ids, new_counts = free[:take], new_ids[:take], new_counts[:take]
        self.row_ids[got] = new_ids
        self.last_step[got] = clock
        self.last_us[got] = now
        self.hits[got] = new_counts
        self._remember(new_ids, got)
        c[_C.index("admitted")] += take
        c[_C.index("evicted")] += evicted
        return Observed(got, take, evicted, expired)

    def _victims(self, need: int, clock: int) -> torch.Tensor:
        """Rows to free for `need` new ids (at least EVICT_SHARE of the table): the least recently
        (lru) or least often (lfu) seen, never one seen this step; ties go to the lower row."""
        score = (self.last_step if self.opts.eviction == "lru" else self.hits).clone()
        score[self.row_ids == EMPTY] = EMPTY  # (no free row is left when this runs)
        score[self.last_step == clock] = EMPTY
        score[0] = EMPTY
        evictable = int((score != EMPTY).sum())
        k = min(evictable, max(need, int(self.rows * EVICT_SHARE)))
        if k == 0:
            return torch.zeros(0, dtype=torch.int64, device=score.device)
        rows = torch.arange(self.rows, device=score.device)
        # one key per row, so the choice is the same on every rank (score * rows + row)
        key = torch.where(score == EMPTY, score, score * self.rows + rows)
        return torch.sort(torch.topk(key, k, largest=False).indices).values

    def _sweep(self, now: int) -> int:
        """ttl: free the rows of ids not seen for ttl_days (a sweep per 1/64 of the ttl of event time)."""
        if now - self.counter("swept_us") < max(1, self.ttl_us // 64):
            return 0
        self.counters[_C.index("swept_us")] = now
        old = (self.row_ids != EMPTY) & (self.last_us < now - self.ttl_us)
        old[0] = False
        n = int(old.sum())
        if n:
            self.row_ids[old] = EMPTY
            self.counters[_C.index("expired")] += n
        return n

    def _remember(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Make new (id, row) entries findable: into `recent`, or rebuild `main` when it is full."""
        used = self.counter("recent_used")
        keys, rws = self.recent_keys[:used], self.recent_rows[:used]
        live = self.row_ids[rws] == keys
        keys, rws = torch.cat([keys[live], ids]), torch.cat([rws[live], rows])
        if keys.numel() > self.recent_cap:
            self._rebuild_main()
            return
        order = torch.sort(keys).indices
        self.recent_keys.fill_(EMPTY)
        self.recent_rows.zero_()
        self.recent_keys[: keys.numel()] = keys[order]
        self.recent_rows[: keys.numel()] = rws[order]
        self.counters[_C.index("recent_used")] = keys.numel()

    def _rebuild_main(self) -> None:
        keys, order = torch.sort(self.row_ids[1:])
        self.main_keys.copy_(keys)
        self.main_rows.copy_(torch.where(keys == EMPTY, torch.zeros_like(order), order + 1))
        self.recent_keys.fill_(EMPTY)
        self.recent_rows.zero_()
        self.counters[_C.index("recent_used")] = 0

    # --- the admission sketch ---------------------------------------------------------------
    def _cells(self, ids: torch.Tensor) -> torch.Tensor:
        width = self.sketch.shape[1]
        return torch.stack([mix64(ids, d) & (width - 1) for d in range(SKETCH_DEPTH)])

    def _sketch_estimate(self, ids: torch.Tensor) -> torch.Tensor:
        cells = self._cells(ids)
        return torch.stack([self.sketch[d, cells[d]] for d in range(SKETCH_DEPTH)]).min(dim=0).values.long()

    def _sketch_add(self, ids: torch.Tensor, counts: torch.Tensor) -> None:
        if ids.numel() == 0:
            return
        cells = self._cells(ids)
        for d in range(SKETCH_DEPTH):
            self.sketch[d].index_add_(0, cells[d], counts.to(torch.int32))
        mass = self.counter("sketch_mass") + int(counts.sum())
        if mass >= self.sketch.shape[1]:  # forget slowly: what counts is the recent stream
            self.sketch.div_(2, rounding_mode="floor")
            mass = 0
        self.counters[_C.index("sketch_mass")] = mass

    def stats(self) -> dict[str, int]:
        """Counts for the run's report."""
        return {"rows": self.rows, "rows_in_use": self.rows_in_use, "admitted": self.counter("admitted"),
                "evicted": self.counter("evicted"), "expired": self.counter("expired")}


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

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: m.stats() for name, m in self.maps.items()}  # type: ignore[operator]  # ModuleDict values are IdRowMaps
