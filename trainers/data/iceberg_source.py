"""The batch phase's reader: global shuffle of work units, a bounded in-rank shuffle, prefetch.

Order of samples on rank r in epoch e, fully determined by (seed, e, r, world size, unit list):
1. units are permuted with `default_rng([seed, e])` and dealt round-robin to ranks;
2. a rank's units are grouped, in that order, into chunks of about `shuffle_rows` rows;
3. a chunk's rows (minus rows outside [T - W, T) and held-out rows) are permuted with
   `default_rng([seed, e, r, chunk])` and cut into batches; a batch may span two chunks.

The cursor (epoch, chunk, offset) is therefore the whole shuffle state: a resume re-reads one
chunk, re-derives its permutation and skips `offset` rows, reproducing the same order without
saving buffer contents.

Reading runs ahead of training on `read_threads` reader threads (pyarrow and numpy release the
GIL). Each unit (row group) is one task: decode, then the window and holdout test, so units
decode in parallel from the first chunk on. A prefetch thread waits for a chunk's units, derives
its permutation and hands the chunk over as pieces of whole batches (one, unless the chunk is
large) whose gathers the reader threads run before any unit of a later chunk. None of this
changes the order above.
"""

from __future__ import annotations

import itertools
import logging
import queue
import sys
import threading
import time
from collections import defaultdict, deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slipstream.errors import ResumeError
from trainers.data.holdout import holdout_mask
from trainers.data.units import Opener, WorkUnit, chunk_bounds, epoch_units, units_digest
from trainers.rows import READ_COLUMNS, SOURCE_ICEBERG, Rows, TableColumns

log = logging.getLogger(__name__)

SHUFFLE_ALGORITHM = "units:default_rng([seed,epoch]).permutation/round-robin; rows:default_rng([seed,epoch,rank,chunk])"


@dataclass
class ChunkStats:
    rows_read: int = 0
    rows_outside_window: int = 0
    rows_holdout: int = 0


def read_units(units: list[WorkUnit], open_file: Opener, footers: dict[str, pq.FileMetaData] | None = None) -> pa.Table:
    """Read the given units (row groups) in the given order into one table. `footers` (path ->
    Parquet footer) saves re-reading a file's footer on every open; footers read here are added."""
    by_file: dict[str, list[int]] = defaultdict(list)
    order: list[str] = []
    for u in units:
        if u.path not in by_file:
            order.append(u.path)
        by_file[u.path].append(u.row_group)
    tables = []
    for path in order:
        with open_file(path) as fh:
            pf = pq.ParquetFile(fh, metadata=None if footers is None else footers.get(path))
            if footers is not None:
                footers[path] = pf.metadata
            present = set(pf.schema_arrow.names)
            names = [c for c in READ_COLUMNS if c in present]
            missing = set(READ_COLUMNS) - set(names)
            if missing:
                raise ValueError(f"data file {path} lacks sample column(s) {sorted(missing)}: it does not hold samples")
            tables.append(pf.read_row_groups(by_file[path], columns=names, use_threads=True))
    if not tables:
        from slipstream.schema import ARROW_SCHEMA

        return ARROW_SCHEMA.empty_table()
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def _window_and_holdout(table: pa.Table, start_us: int, end_us: int, stats: ChunkStats) -> tuple[np.ndarray, np.ndarray]:
    """(rows inside [start, end), held-out rows) as boolean masks, counted into stats."""
    stats.rows_read += table.num_rows
    ts = pc.cast(table.column("event_time"), pa.int64()).to_numpy()
    inside = (ts >= start_us) & (ts < end_us)
    hold = holdout_mask(table.column("sample_id"))
    stats.rows_outside_window += int(table.num_rows - np.count_nonzero(inside))
    stats.rows_holdout += int(np.count_nonzero(inside & hold))
    return inside, hold


def select_rows(table: pa.Table, start_us: int, end_us: int, stats: ChunkStats) -> tuple[pa.Table, pa.Table]:
    """(training rows, held-out rows) of the table inside [start, end)."""
    inside, hold = _window_and_holdout(table, start_us, end_us, stats)
    return table.filter(pa.array(inside & ~hold)), table.filter(pa.array(inside & hold))


@dataclass
class _UnitPart:
    """One unit as a reader thread returns it."""

    table: pa.Table
    keep: np.ndarray
    """True for the rows that train (inside the window, not held out)."""
    stats: ChunkStats
    bits: tuple[np.ndarray, int, int] | None
    """What `IcebergSource._unit_rows` keeps of the unit after its first read, else None."""


class _End:
    pass


PIECE_ROWS = 131_072
"""At most about this many rows of a chunk are gathered as one task (a larger chunk is cut into
equal pieces of whole batches, spread over the reader threads). Pieces of 16k-32k rows cost more
CPU than they save in waiting (each Arrow `take` has a cost per call): with the default shuffle
buffer a chunk is one piece, and two chunks' gathers can still run at once."""


class _PriorityPool:
    """Worker threads that run the most urgent task first (lowest priority tuple, then FIFO), so
    gathering the chunk the trainer needs next goes before decoding units of later chunks."""

    def __init__(self, threads: int, name: str) -> None:
        self._tasks: queue.PriorityQueue[Any] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{k}", daemon=True) for k in range(threads)]
        for t in self._threads:
            t.start()

    def submit(self, priority: tuple[int, int], fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._tasks.put((priority, next(self._seq), future, fn, args, kwargs))
        return future

    def _work(self) -> None:
        while True:
            _, _, future, fn, args, kwargs = self._tasks.get()
            if fn is None:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # handed to whoever waits on the future
                future.set_exception(e)

    def shutdown(self) -> None:
        """Cancel the tasks not started, let the running ones finish, stop the threads."""
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                break
            if task[2] is not None:
                task[2].cancel()
        last = (sys.maxsize, sys.maxsize)
        for _ in self._threads:
            self._tasks.put((last, next(self._seq), None, None, (), {}))
        for t in self._threads:
            t.join()


class IcebergSource:
    """Batches of one rank for the batch phase. Not thread-safe: one consumer (the train loop)."""

    def __init__(
        self,
        units: list[WorkUnit],
        open_file: Opener,
        *,
        rank: int,
        world: int,
        seed: int,
        batch_size: int,
        shuffle_rows: int,
        window_us: tuple[int, int],
        prefetch_chunks: int = 2,
        read_threads: int = 2,
    ) -> None:
        self.units = units
        self.open_file = open_file
        self.rank, self.world, self.seed = rank, world, seed
        self.batch_size = batch_size
        self.shuffle_rows = shuffle_rows
        self.window_us = window_us
        self.prefetch_chunks = max(1, prefetch_chunks)
        # units (row groups) decoded at the same time. At most prefetch_chunks + 1 chunks are held
        # ahead of the consumer: one queued, one being assembled, the rest being read
        self.read_threads = max(1, read_threads)
        self.digest = units_digest(units)
        self.stats = ChunkStats()
        self.wait_s = 0.0
        self.epoch = 0
        self._chunk = 0
        self._pos = 0
        self._rows: Rows | None = None
        self._base = 0
        """Position of self._rows (the piece being trained) in its chunk's order."""
        self._pieces: deque[tuple[int, Future[Rows]]] = deque()
        self._pool: _PriorityPool | None = None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._done = True
        self._skip = 0
        self._n_chunks = 0
        self._unit_rows: dict[int, tuple[np.ndarray, int, int]] = {}
        """unit index -> (training rows as packed bits, rows outside the window, held-out rows)"""
        self._footers: dict[str, pq.FileMetaData] = {}
        """path -> Parquet footer, read once (each unit opens its file on its own)"""

    # --- plan of an epoch -------------------------------------------------------------------
    def epoch_plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        order = epoch_units(len(self.units), epoch, self.seed, self.rank, self.world)
        rows = np.asarray([self.units[i].rows for i in order], dtype=np.int64)
        return order, chunk_bounds(rows, self.shuffle_rows)

    def chunk_units(self, order: np.ndarray, bounds: np.ndarray, chunk: int) -> list[int]:
        """The chunk's units in table-row order (sorted: the read order does not matter, rows are permuted)."""
        return np.sort(order[bounds[chunk] : bounds[chunk + 1]]).tolist()

    def read_chunk(self, epoch: int, order: np.ndarray, bounds: np.ndarray, chunk: int, stats: ChunkStats | None = None) -> Rows:
        """One chunk's rows in training order, read in this thread (the background reader does
        the same with units and pieces of the gather spread over its threads)."""
        ids = self.chunk_units(order, bounds, chunk)
        parts = [self._read_unit(i) for i in ids]
        self._keep_unit_rows(ids, parts)
        cols, take = self._chunk_order(epoch, chunk, parts, self.stats if stats is None else stats)
        return cols.rows(take, source=SOURCE_ICEBERG, epoch=epoch)

    def _read_unit(self, i: int) -> _UnitPart:
        """Read one unit (row group) and find its training rows. A reader thread runs this for
        one unit at a time, so units of a chunk decode in parallel. (Decoding on the reader thread
        itself, without pyarrow's column threads, measured ~15 % more CPU per epoch.)"""
        unit = self.units[i]
        table = read_units([unit], self.open_file, footers=self._footers)
        known = self._unit_rows.get(i)
        if known is not None:  # which rows train depends only on the unit's data: kept from its first read
            bits, outside, held = known
            keep = np.unpackbits(bits, count=unit.rows).view(bool)
            return _UnitPart(table, keep, ChunkStats(table.num_rows, outside, held), None)
        stats = ChunkStats()
        inside, hold = _window_and_holdout(table, *self.window_us, stats)
        keep = inside & ~hold
        return _UnitPart(table, keep, stats, (np.packbits(keep), stats.rows_outside_window, stats.rows_holdout))

    def _chunk_order(self, epoch: int, chunk: int, parts: list[_UnitPart], stats: ChunkStats) -> tuple[TableColumns, np.ndarray]:
        """(the chunk's columns, the row index of each training row in training order): its
        units' rows in order, filtered, permuted with default_rng([seed, epoch, rank, chunk]).
        Gathering `take` (in pieces or at once) yields the chunk's rows: one gather per column
        straight from the read table (no filtered copy, no second permuted copy)."""
        for p in parts:
            stats.rows_read += p.stats.rows_read
            stats.rows_outside_window += p.stats.rows_outside_window
            stats.rows_holdout += p.stats.rows_holdout
        tables = [p.table for p in parts]
        if not tables:
            from slipstream.schema import ARROW_SCHEMA

            tables = [ARROW_SCHEMA.empty_table()]
        table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
        train = np.flatnonzero(np.concatenate([p.keep for p in parts])) if parts else np.zeros(0, dtype=np.int64)
        perm = np.random.default_rng([self.seed, epoch, self.rank, chunk]).permutation(len(train))
        return TableColumns(table), train[perm]

    def _piece_ranges(self, start: int, stop: int, handed: int) -> list[tuple[int, int]]:
        """Row ranges [a, b) of a chunk's training order from `start`, gathered as separate tasks.
        Cuts fall on batch boundaries (`handed` rows came before the chunk), so a batch spans two
        pieces only where it spans two chunks."""
        batch = self.batch_size
        head = (-handed) % batch  # the rows that complete the batch begun in the previous chunk
        n = max(1, -(-(stop - start - head) // PIECE_ROWS))
        step = max(1, -(-(stop - start - head) // (n * batch))) * batch  # n about equal pieces of whole batches
        out, a, b = [], start, start + head + step
        while a < stop:
            b = min(b, stop)
            out.append((a, b))
            a, b = b, b + step
        return out

    def _keep_unit_rows(self, units: list[int], parts: list[_UnitPart]) -> None:
        for i, p in zip(units, parts):
            if p.bits is not None:
                self._unit_rows[i] = p.bits

    # --- iteration --------------------------------------------------------------------------
    def start_epoch(self, epoch: int, chunk: int = 0, offset: int = 0) -> None:
        self.close()
        self.epoch, self._chunk, self._pos, self._base = epoch, chunk, 0, 0
        self._rows = None
        self._pieces = deque()
        self._skip = offset
        order, bounds = self.epoch_plan(epoch)
        self._n_chunks = len(bounds) - 1
        self._queue = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._done = False
        self._pool = _PriorityPool(self.read_threads, f"iceberg-read-r{self.rank}")
        self._thread = threading.Thread(
            target=self._read_ahead, args=(epoch, order, bounds, chunk, offset, self._queue, self._stop, self._pool),
            name=f"iceberg-prefetch-r{self.rank}", daemon=True,
        )
        self._thread.start()

    def _read_ahead(self, epoch: int, order: np.ndarray, bounds: np.ndarray, first: int, skip: int,
                    q: queue.Queue[Any], stop: threading.Event, pool: _PriorityPool) -> None:
        """Reader threads decode units in chunk order, up to prefetch_chunks + 1 chunks ahead of
        the trainer (counting the one queued). Once a chunk's units are in, this thread works out
        its order and hands it over as pieces whose gathers the reader threads run before any
        unit of a later chunk; the trainer waits only for the piece it needs next."""
        try:
            pending: deque[tuple[list[int], list[Future[_UnitPart]]]] = deque()
            nxt, end, handed = first, len(bounds) - 1, 0
            for c in range(first, end):
                while nxt < end and nxt <= c + self.prefetch_chunks - q.qsize():
                    ids = self.chunk_units(order, bounds, nxt)
                    pending.append((ids, [pool.submit((nxt, 1), self._read_unit, i) for i in ids]))
                    nxt += 1
                ids, futures = pending.popleft()
                parts = [f.result() for f in futures]
                self._keep_unit_rows(ids, parts)
                cols, take = self._chunk_order(epoch, c, parts, self.stats)
                del parts
                start = min(skip, len(take)) if c == first else 0
                pieces = [(a, pool.submit((c, 0), cols.rows, take[a:b], source=SOURCE_ICEBERG, epoch=epoch))
                          for a, b in self._piece_ranges(start, len(take), handed)]
                handed += len(take) - start
                while not stop.is_set():
                    try:
                        q.put((c, pieces), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_End())
        except BaseException as e:  # surfaced in the training thread
            q.put(e)

    def _next_chunk(self) -> bool:
        started = time.perf_counter()
        item = self._queue.get()
        self.wait_s += time.perf_counter() - started
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, _End):
            self._done = True
            self._rows = None
            self._chunk, self._pos, self._base = self._n_chunks, 0, 0
            return False
        self._chunk, pieces = item
        self._pieces = deque(pieces)
        self._rows, self._pos, self._base = None, 0, 0
        self._skip = 0  # applied by the reader: the first piece starts at the resume offset
        return True

    def _next_piece(self) -> bool:
        while not self._pieces:
            if not self._next_chunk():
                return False
        base, future = self._pieces.popleft()
        started = time.perf_counter()
        rows = future.result()
        self.wait_s += time.perf_counter() - started
        self._rows, self._base, self._pos = rows, base, 0
        return True

    def next_batch(self) -> Rows | None:
        """Up to batch_size rows, or None when this rank's epoch is exhausted."""
        parts: list[Rows] = []
        need = self.batch_size
        while need > 0 and not self._done:
            if self._rows is None or self._pos >= len(self._rows):
                if not self._next_piece():
                    break
                continue
            take = min(need, len(self._rows) - self._pos)
            parts.append(self._rows.slice(self._pos, self._pos + take))
            self._pos += take
            need -= take
        if not parts:
            return None
        return Rows.concat(parts)

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            while self._thread.is_alive():
                try:  # unblock a producer waiting on a full queue
                    self._queue.get_nowait()
                except queue.Empty:
                    self._thread.join(timeout=0.05)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self._pieces = deque()

    # --- checkpoint state -------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Position after the last batch returned (what a resume continues from)."""
        return {
            "epoch": self.epoch,
            "chunk": int(self._chunk),
            "offset": int(self._base + self._pos if self._rows is not None else self._skip),
            "rank": self.rank,
            "world": self.world,
            "seed": self.seed,
            "shuffle_rows": self.shuffle_rows,
            "units_digest": self.digest,
            "algorithm": SHUFFLE_ALGORITHM,
        }

    def check_resumable(self, state: dict[str, Any]) -> None:
        for key, mine in (("world", self.world), ("rank", self.rank), ("units_digest", self.digest),
                          ("seed", self.seed), ("shuffle_rows", self.shuffle_rows)):
            if state.get(key) != mine:
                raise ResumeError(
                    f"batch-phase checkpoint was written with {key}={state.get(key)!r} but this run has {key}={mine!r}: "
                    "the sample order of the batch phase depends on it, so resuming would lose or repeat samples. "
                    + ("Resume with the same --nproc-per-node (world size) as the checkpoint." if key in ("world", "rank")
                       else "Resume with the checkpoint's config (same snapshot, seed and shuffle buffer).")
                )
