"""Work units of the batch phase: (data file, row group) of the window's file plan at snapshot S.

A row group is the smallest piece of a Parquet file that can be read alone, so it is the unit
the global shuffle permutes across ranks. Files are opened through the node-local cache
(`slipstream.cache.reader.CacheReader`) when a cache folder is configured, else through the
table's own FileIO (local disk, S3 ...).
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import pyarrow.parquet as pq

from slipstream.cache.reader import CacheReader
from slipstream.errors import ConfigError
from slipstream.lake.planning import WindowPlan

log = logging.getLogger(__name__)

Opener = Callable[[str], Any]
"""path -> a seekable file object pyarrow can read."""


@dataclass(frozen=True)
class WorkUnit:
    path: str
    row_group: int
    rows: int


def file_opener(io: Any, cache_dir: str | None) -> tuple[Opener, CacheReader | None]:
    """(open(path), cache reader or None): files through the node-local cache when `cache_dir` is
    set (`slipstream.cache.reader`), else through the table's FileIO."""
    if cache_dir:
        reader = CacheReader(cache_dir, dict(getattr(io, "properties", {}) or {}))
        return reader.open_input_file, reader
    return (lambda path: io.new_input(path).open(seekable=True)), None


def plan_units(plan: WindowPlan, open_file: Opener, threads: int = 8) -> list[WorkUnit]:
    """One unit per row group of every planned file, in (path, row group) order."""
    for f in plan.files:
        if f.delete_files:
            raise ConfigError(
                f"data file {f.path} at snapshot {plan.snapshot_id} has delete files {list(f.delete_files)}: "
                "the trainer reads whole row groups; compact the table (rewrite the day) before training"
            )
    started = time.monotonic()

    def footer(path: str) -> list[WorkUnit]:
        with open_file(path) as fh:
            md = pq.ParquetFile(fh).metadata
            return [WorkUnit(path, i, md.row_group(i).num_rows) for i in range(md.num_row_groups)]

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(plan.files)))) as pool:
        per_file = list(pool.map(footer, [f.path for f in plan.files]))
    units = [u for us in per_file for u in us if u.rows > 0]
    log.info(
        "%d work units (row groups) in %d files, %d rows; footers read in %.2fs",
        len(units), len(plan.files), sum(u.rows for u in units), time.monotonic() - started,
    )
    return units


def units_digest(units: list[WorkUnit]) -> str:
    """Identifies the unit list, so a resume can check it reads the same plan."""
    h = hashlib.sha256()
    for u in units:
        h.update(f"{u.path}\0{u.row_group}\0{u.rows}\n".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class EpochPlan:
    """What one rank reads in an epoch: units in read order, the rows of each it trains
    (`spans[i]` = [start, stop) within unit `order[i]`) and the chunk bounds over them."""

    order: np.ndarray
    spans: np.ndarray
    bounds: np.ndarray

    @property
    def n_chunks(self) -> int:
        return len(self.bounds) - 1

    def chunk(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """(unit indices, their spans) of chunk c."""
        a, b = int(self.bounds[c]), int(self.bounds[c + 1])
        return self.order[a:b], self.spans[a:b]


def epoch_spans(unit_rows: np.ndarray, epoch: int, seed: int, rank: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    """(unit indices, row spans) rank `rank` reads in `epoch`. Every unit, in a seeded permutation
    (the global shuffle), laid end to end and cut into `world` runs of equal rows (to one row);
    rank r takes run r. A unit across a cut is read by both ranks, each training its own rows of
    it, so a window of few large row groups still keeps every rank busy to the end of the epoch.
    Same seed and epoch -> same order everywhere."""
    perm = np.random.default_rng([seed, epoch]).permutation(len(unit_rows))
    edges = np.concatenate([[0], np.cumsum(np.asarray(unit_rows, dtype=np.int64)[perm])])
    total = int(edges[-1])
    lo, hi = total * rank // world, total * (rank + 1) // world
    at = np.arange(np.searchsorted(edges, lo, side="right") - 1, np.searchsorted(edges, hi, side="left"))
    at = at[(at >= 0) & (at < len(perm))]
    starts, stops = np.maximum(edges[at], lo) - edges[at], np.minimum(edges[at + 1], hi) - edges[at]
    some = stops > starts
    return perm[at[some]], np.stack([starts[some], stops[some]], axis=1).reshape(-1, 2)


def epoch_plan(unit_rows: np.ndarray, epoch: int, seed: int, rank: int, world: int, shuffle_rows: int) -> EpochPlan:
    order, spans = epoch_spans(unit_rows, epoch, seed, rank, world)
    return EpochPlan(order, spans, chunk_bounds(spans[:, 1] - spans[:, 0], shuffle_rows))


def chunk_bounds(unit_rows: np.ndarray, target_rows: int) -> np.ndarray:
    """Start index of each chunk of consecutive units, closing a chunk once it holds target_rows
    rows (plus the end index). A chunk is what the in-rank shuffle buffer mixes."""
    bounds = [0]
    acc = 0
    for i, r in enumerate(unit_rows):
        acc += int(r)
        if acc >= target_rows:
            bounds.append(i + 1)
            acc = 0
    if bounds[-1] != len(unit_rows):
        bounds.append(len(unit_rows))
    return np.asarray(bounds, dtype=np.int64)


def units_to_dicts(units: list[WorkUnit]) -> list[dict[str, Any]]:
    return [asdict(u) for u in units]
