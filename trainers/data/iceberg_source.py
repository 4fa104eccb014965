"""The batch phase's reader: global shuffle of work units, a bounded in-rank shuffle, prefetch.

Order of samples on rank r in epoch e, fully determined by (seed, e, r, world size, unit list):
1. units are permuted with `default_rng([seed, e])`, laid end to end and cut into `world` runs of
   equal rows; rank r reads run r (a unit across a cut is read by both ranks, each training its
   own span of it: `units.epoch_spans`);
2. a rank's unit spans are grouped, in that order, into chunks of about `shuffle_rows` rows;
3. a chunk's rows (minus rows outside [T - W, T) and held-out rows) are permuted with
   `default_rng([seed, e, r, chunk])` and cut into batches; a batch may span two chunks.

The cursor (epoch, chunk, offset) is therefore the whole shuffle state (`state_dict`): a resume
(`load_state_dict`) re-reads one chunk, re-derives its permutation and skips `offset` rows,
reproducing the same order without saving buffer contents. A background thread reads and permutes chunks ahead of training, up to
`read_threads` chunks at a time (pyarrow and numpy release the GIL) and never more than
`prefetch_chunks + 1` ahead of the consumer, each chunk's row groups decoded side by side, and
hands them over in order.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import defaultdict, deque
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slipstream.errors import ResumeError
from trainers.data.holdout import holdout_mask
from trainers.data.redeal import Piece, deal, pieces_plan, remaining_pieces
from trainers.data.units import EpochPlan, Opener, WorkUnit, epoch_plan, units_digest
from slipstream.samples.spec import EVENT_TIME, LABEL, SAMPLE_ID
from trainers.data.rows import DEFAULT_LAYOUT, SOURCE_ICEBERG, RowLayout, Rows
from trainers.checkpoint.stateful import check_version

log = logging.getLogger(__name__)

STATE_VERSION = 1
SHUFFLE_ALGORITHM = "units:default_rng([seed,epoch]).permutation/equal-row-runs; rows:default_rng([seed,epoch,rank,chunk])"


@dataclass
class ChunkStats:
    rows_read: int = 0
    rows_outside_window: int = 0
    rows_holdout: int = 0


def read_units(units: list[WorkUnit], open_file: Opener, pool: Executor | None = None,
               submitted: Callable[[], None] | None = None, layout: RowLayout = DEFAULT_LAYOUT) -> pa.Table:
    """Read the given units (row groups) in the given order into one table. With a pool, every
    row group is read by a task of its own (each file is still opened once), so Arrow decodes the
    row groups side by side: a chunk's slowest column (the history lists) is then split across
    cores instead of being decoded one row group after another. `submitted` is called once every
    read is queued on the pool (or, without one, before reading). A file lacking one of the
    layout's feature columns (written before the spec had the feature) is read without it: `Rows`
    gives those rows the feature's default."""
    by_file: dict[str, list[int]] = defaultdict(list)
    for u in units:
        by_file[u.path].append(u.row_group)  # files in order of first appearance
    with contextlib.ExitStack() as files:
        readers = []
        for path, groups in by_file.items():
            fh = files.enter_context(open_file(path))
            pf = pq.ParquetFile(fh)
            present = set(pf.schema_arrow.names)
            names = [c for c in layout.read_columns if c in present]
            missing = {SAMPLE_ID, EVENT_TIME, LABEL} - present
            if missing:
                raise ValueError(f"data file {path} lacks sample column(s) {sorted(missing)}: it does not hold samples")
            readers.append((fh, pf, groups, names))
        if pool is None or len(units) < 2:
            if submitted is not None:
                submitted()
            tables = [pf.read_row_groups(groups, columns=names, use_threads=True) for _, pf, groups, names in readers]
        else:
            # one ParquetFile per task over the file's shared handle (ReadAt is thread-safe) and footer
            futures = [pool.submit(_read_group, fh, pf.metadata, g, names) for fh, pf, groups, names in readers for g in groups]
            if submitted is not None:
                submitted()
            wait(futures)  # every read is done before the files close, even when one failed
            tables = [f.result() for f in futures]
    if not tables:
        from slipstream.samples.schema import ARROW_SCHEMA

        return ARROW_SCHEMA.empty_table()
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def _read_group(fh: Any, metadata: pq.FileMetaData, group: int, columns: list[str]) -> pa.Table:
    return pq.ParquetFile(fh, metadata=metadata).read_row_group(group, columns=columns, use_threads=True)


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


class _End:
    pass


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
        read_threads: int = 3,
        layout: RowLayout = DEFAULT_LAYOUT,
    ) -> None:
        self.units = units
        self.layout = layout
        self.open_file = open_file
        self.rank, self.world, self.seed = rank, world, seed
        self.batch_size = batch_size
        self.shuffle_rows = shuffle_rows
        self.window_us = window_us
        self.prefetch_chunks = prefetch_chunks
        # chunks read at the same time. At most prefetch_chunks + 1 are ever held ahead of the
        # consumer (being read or queued): a chunk's read takes one of that many slots, and the
        # consumer frees it when it takes the chunk, so the next read starts then, not when a
        # queued chunk leaves a full queue
        self.read_threads = max(1, min(read_threads, prefetch_chunks + 1))
        self.digest = units_digest(units)
        self.stats = ChunkStats()
        self.wait_s = 0.0
        self.epoch = 0
        self._chunk = 0
        self._pos = 0
        self._rows: Rows | None = None
        self._queue: queue.Queue[Any] = queue.Queue()
        self._slots = threading.Semaphore(prefetch_chunks + 1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._done = True
        self._skip = 0
        self._n_chunks = 0
        self._resume_at: tuple[int, int, int] | None = None
        """(epoch, chunk, offset) of a loaded checkpoint state, until that epoch starts"""
        self._pieces: list[Piece] | None = None
        """In an epoch re-dealt on another world size (`redeal`): this rank's pieces, read as its chunks"""
        self._base_world = world
        self._unit_rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        """unit index -> (rows inside the window, held-out rows), as packed bits"""
        self._unit_sizes = np.asarray([u.rows for u in units], dtype=np.int64)

    # --- plan of an epoch -------------------------------------------------------------------
    def epoch_plan(self, epoch: int, rank: int | None = None, world: int | None = None) -> EpochPlan:
        """What a rank reads in `epoch` (default: this rank)."""
        rank, world = (self.rank, self.world) if rank is None or world is None else (rank, world)
        return epoch_plan(self._unit_sizes, epoch, self.seed, rank, world, self.shuffle_rows)

    def read_chunk(self, epoch: int, plan: EpochPlan, chunk: int, stats: ChunkStats | None = None,
                   pool: Executor | None = None, submitted: Callable[[], None] | None = None) -> Rows:
        order, spans = plan.chunk(chunk)
        by_unit = np.argsort(order, kind="stable")  # read order does not matter: rows are permuted
        idx, spans = order[by_unit], spans[by_unit]
        table = read_units([self.units[i] for i in idx], self.open_file, pool, submitted, self.layout)
        train = self._training_rows(table, idx, spans, self.stats if stats is None else stats)
        rank, key = (self.rank, chunk) if self._pieces is None else self._pieces[chunk][:2]
        perm = np.random.default_rng([self.seed, epoch, rank, key]).permutation(len(train))
        # row i of the chunk is training row perm[i]: one gather per column straight from the read
        # table (no filtered copy, no second permuted copy)
        return Rows.from_arrow(table, self.layout, source=SOURCE_ICEBERG, epoch=epoch, take=train[perm])

    def _training_rows(self, table: pa.Table, unit_ids: np.ndarray, spans: np.ndarray, stats: ChunkStats) -> np.ndarray:
        """Ascending indices of the training rows (inside the window, not held out, inside the
        unit's span) of a chunk's table (its units' whole rows, in `unit_ids` order). Which rows
        of a unit are inside the window or held out depends only on the unit's data, so it is
        worked out on the unit's first read and kept (one bit each per row): later epochs skip the
        window check and the id hash. `stats` counts the spans' rows only."""
        sizes = self._unit_sizes[unit_ids]
        edges = np.concatenate([[0], np.cumsum(sizes)])
        if any(i not in self._unit_rows for i in unit_ids.tolist()):
            inside, hold = _window_and_holdout(table, *self.window_us, ChunkStats())
            for i, a, b in zip(unit_ids.tolist(), edges[:-1], edges[1:]):
                self._unit_rows[i] = (np.packbits(inside[a:b]), np.packbits(hold[a:b]))
        else:
            known = [self._unit_rows[i] for i in unit_ids.tolist()]
            inside = np.concatenate([np.unpackbits(bits, count=n).view(bool) for (bits, _), n in zip(known, sizes.tolist())])
            hold = np.concatenate([np.unpackbits(bits, count=n).view(bool) for (_, bits), n in zip(known, sizes.tolist())])
        in_span = np.zeros(len(inside), dtype=bool)
        for a, (start, stop) in zip(edges[:-1].tolist(), spans.tolist()):
            in_span[a + start : a + stop] = True
        inside &= in_span
        n_span = int(np.count_nonzero(in_span))
        stats.rows_read += n_span
        stats.rows_outside_window += n_span - int(np.count_nonzero(inside))
        stats.rows_holdout += int(np.count_nonzero(inside & hold))
        return np.flatnonzero(inside & ~hold)

    # --- iteration --------------------------------------------------------------------------
    def start_epoch(self, epoch: int, chunk: int | None = None, offset: int | None = None) -> None:
        """Start reading `epoch` at (chunk, offset); without them, where a loaded state left the
        epoch (or at its start)."""
        if chunk is None or offset is None:
            at = self._resume_at
            chunk, offset = (at[1], at[2]) if at is not None and at[0] == epoch else (0, 0)
            if at is None or at[0] != epoch:
                self._pieces = None  # a re-dealt epoch is over: the next ones follow this world's plan
        self._resume_at = None
        self.close()
        self.epoch, self._chunk, self._pos = epoch, chunk, 0
        self._rows = None
        self._skip = offset
        plan = self.epoch_plan(epoch) if self._pieces is None else \
            pieces_plan(lambda r: self.epoch_plan(epoch, r, self._base_world), self._pieces)
        self._n_chunks = plan.n_chunks
        self._queue = queue.Queue()  # bounded by the slots
        self._slots = threading.Semaphore(self.prefetch_chunks + 1)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=self._read_ahead, args=(epoch, plan, chunk, self._queue, self._slots, self._stop),
            name=f"iceberg-prefetch-r{self.rank}", daemon=True,
        )
        self._thread.start()

    def _read_ahead(self, epoch: int, plan: EpochPlan, first: int, q: queue.Queue[Any],
                    slots: threading.Semaphore, stop: threading.Event) -> None:
        pool = ThreadPoolExecutor(self.read_threads, thread_name_prefix=f"iceberg-read-r{self.rank}") if self.read_threads > 1 else None
        # the row groups of the chunks being read, queued in chunk order (see `read`): a few at a
        # time, so the chunk needed first is decoded first; these threads wait while Arrow's pool
        # decodes
        groups = ThreadPoolExecutor(4, thread_name_prefix=f"iceberg-group-r{self.rank}")
        turn = [first]  # the chunk whose row groups are queued next
        turns = threading.Condition()

        def queued(c: int) -> None:
            with turns:
                if turn[0] == c:
                    turn[0] += 1
                    turns.notify_all()

        def read(c: int) -> tuple[Rows, ChunkStats] | None:
            while not slots.acquire(timeout=0.1):  # wait for the consumer to take an earlier chunk
                if stop.is_set():
                    return None
            with turns:
                while turn[0] != c:
                    if stop.is_set():
                        return None
                    turns.wait(0.1)
            stats = ChunkStats()
            try:
                return self.read_chunk(epoch, plan, c, stats, groups, lambda: queued(c)), stats
            finally:
                queued(c)  # also when the read failed before queueing anything

        try:
            pending: deque[Future[tuple[Rows, ChunkStats] | None]] = deque()
            nxt, end = first, plan.n_chunks
            for c in range(first, end):
                # keep read_threads chunks being read (or waiting for a slot): this one and the
                # next ones, in order
                while pool is not None and nxt < end and len(pending) < self.read_threads:
                    pending.append(pool.submit(read, nxt))
                    nxt += 1
                done = pending.popleft().result() if pool is not None else read(c)
                if done is None or stop.is_set():
                    return
                rows, stats = done
                self.stats.rows_read += stats.rows_read
                self.stats.rows_outside_window += stats.rows_outside_window
                self.stats.rows_holdout += stats.rows_holdout
                q.put((c, rows))
            q.put(_End())
        except BaseException as e:  # surfaced in the training thread
            q.put(e)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            groups.shutdown(wait=True, cancel_futures=True)

    def _next_chunk(self) -> bool:
        started = time.perf_counter()
        item = self._queue.get()
        self.wait_s += time.perf_counter() - started
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, _End):
            self._done = True
            self._rows = None
            self._chunk, self._pos = self._n_chunks, 0
            return False
        self._chunk, self._rows = item
        self._slots.release()  # the reader may start the chunk after the ones it holds
        piece_skip = self._pieces[self._chunk][2] if self._pieces is not None else 0
        self._pos = min(max(self._skip, piece_skip), len(self._rows))
        self._skip = 0
        return True

    def next_batch(self) -> Rows | None:
        """Up to batch_size rows, or None when this rank's epoch is exhausted."""
        parts: list[Rows] = []
        need = self.batch_size
        while need > 0 and not self._done:
            if self._rows is None or self._pos >= len(self._rows):
                if not self._next_chunk():
                    break
                continue
            assert self._rows is not None
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
                try:  # drop the chunks read ahead
                    self._queue.get_nowait()
                except queue.Empty:
                    self._thread.join(timeout=0.05)
            self._thread = None

    # --- checkpoint state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Position after the last batch returned (what a resume continues from)."""
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "chunk": int(self._chunk),
            "offset": int(self._pos if self._rows is not None else self._skip),
            "rank": self.rank,
            "world": self.world,
            "seed": self.seed,
            "shuffle_rows": self.shuffle_rows,
            "units_digest": self.digest,
            "algorithm": SHUFFLE_ALGORITHM,
            **({"pieces": [list(p) for p in self._pieces], "base_world": self._base_world} if self._pieces is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a checkpoint's cursor: the next `start_epoch` of its epoch skips the chunks
        and rows already trained. Refused (ResumeError) when the sample order would differ."""
        if "redeal" in state:
            return self._load_redeal(state["redeal"])
        check_version("Iceberg source", state, STATE_VERSION)
        try:
            cursor = (int(state["epoch"]), int(state["chunk"]), int(state["offset"]))
        except (KeyError, TypeError, ValueError):
            raise ResumeError(f"the checkpoint's Iceberg cursor {state!r} lacks epoch/chunk/offset: it is damaged") from None
        if "units_digest" in state or cursor[1:] != (0, 0):  # mid-epoch: only the same order continues
            self.check_resumable(state)
        if state.get("pieces") is not None:
            self._pieces = [tuple(int(x) for x in p) for p in state["pieces"]]  # type: ignore[misc]
            self._base_world = int(state["base_world"])
        self._resume_at = cursor

    def _load_redeal(self, states: list[dict[str, Any]]) -> None:
        """Resume mid-epoch from the Iceberg states of a run on another world size: this rank takes
        its share of what every old rank had left of the epoch (`trainers.data.redeal`)."""
        for s in states:
            check_version("Iceberg source", s, STATE_VERSION)
            self.check_resumable(s, same_world=False)
        epoch, self._base_world, pieces = remaining_pieces(states, lambda e, r, w: self.epoch_plan(e, r, w).n_chunks)
        self._pieces = deal(pieces, self.rank, self.world)
        self._resume_at = (epoch, 0, 0)
        log.info("rank %d/%d takes %d of the %d chunk piece(s) left of epoch %d by %d rank(s)", self.rank, self.world,
                 len(self._pieces), len(pieces), epoch, len(states))

    def check_resumable(self, state: dict[str, Any], same_world: bool = True) -> None:
        keys = (("world", self.world), ("rank", self.rank)) if same_world else ()
        for key, mine in (*keys, ("units_digest", self.digest), ("seed", self.seed), ("shuffle_rows", self.shuffle_rows)):
            if state.get(key) != mine:
                raise ResumeError(
                    f"batch-phase checkpoint was written with {key}={state.get(key)!r} but this run has {key}={mine!r}: "
                    "the sample order of the batch phase depends on it, so resuming would lose or repeat samples. "
                    + ("Resume with the same --nproc-per-node (world size) as the checkpoint." if key in ("world", "rank")
                       else "Resume with the checkpoint's config (same snapshot, seed and shuffle buffer).")
                )
        mid_epoch = (state.get("chunk", 0), state.get("offset", 0)) != (0, 0) or state.get("pieces") is not None
        if mid_epoch and state.get("algorithm") != SHUFFLE_ALGORITHM:
            raise ResumeError(
                f"batch-phase checkpoint stopped mid-epoch {state.get('epoch')} under the shuffle {state.get('algorithm')!r}; "
                f"this Slipstream deals the epoch as {SHUFFLE_ALGORITHM!r}, so resuming would lose or repeat samples. "
                "Finish the epoch with the Slipstream that wrote the checkpoint, or start a new run."
            )
