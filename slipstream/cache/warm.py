"""Warm the node-local cache with exactly what the next training run reads: the files of the
training window at a pinned Iceberg snapshot (data and delete files, manifests, manifest list,
table metadata).

`warm_plan` takes a run's planned files (`RunPlan`), `warm_window` plans a window itself (the
hourly warmup of the next run's window); `warm_files` does the work under the cache lock: clear
dead temporary files, evict what left the window, make room under the budget (least recently
used first), copy the missing files (`transfer.Transfer`: enough requests in flight to hide the
store's latency; each file through a temp name, verified, renamed; large ones as parallel ranges;
many small files packed into blocks by `pack.BlockWriter`, built the same way) with retries, and
record placed files in the index as they land (in batches), so an interrupted warmup resumes
where it stopped.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from slipstream.cache.copy import Placed, clear_tmp
from slipstream.cache.evict import Evicted, lru_victims, out_of_window, remove_entries
from slipstream.cache.index import Block, CacheIndex, CacheLayout, Entry, cache_lock
from slipstream.cache.inflight import CONTROL_S
from slipstream.cache.pack import reconcile_blocks
from slipstream.cache.remote import cache_key, filesystem_for
from slipstream.cache.settings import CacheSettings, WarmKnobs
from slipstream.cache.transfer import Transfer, drain, plan_requests
from slipstream.errors import CacheWarmError
from slipstream.settings import Settings

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from slipstream.lake.planning import WindowFile
    from slipstream.pipeline.runplan import RunPlan

log = logging.getLogger(__name__)

DATA_KINDS = ("data", "delete")
PROGRESS_EVERY_S = 2.0
INDEX_BATCH = 1024
DEFAULT_KNOBS = WarmKnobs()
"""The knobs of a warmup given none (frozen: one instance serves every call)."""


@dataclass(frozen=True)
class CacheItem:
    """One file to hold in the cache."""

    remote: str
    size: int | None
    """Size from the table metadata (None for metadata files, whose size Iceberg does not record)."""
    kind: str = "data"
    """data | delete | manifest | manifest_list | metadata."""


@dataclass
class WarmReport:
    table: str
    snapshot_id: int | None
    window_start: str | None
    window_end: str | None
    cache_dir: str
    planned_files: int = 0
    planned_bytes: int = 0
    copied: int = 0
    packed: int = 0
    """Of the copied files, how many were packed into blocks."""
    blocks: int = 0
    already_cached: int = 0
    already_cached_bytes: int = 0
    evicted: int = 0
    evicted_bytes: int = 0
    evicted_out_of_window: int = 0
    evicted_lru: int = 0
    skipped_over_budget: int = 0
    stale_tmp_removed: int = 0
    bytes: int = 0
    """Bytes copied by this run."""
    seconds: float = 0.0
    concurrency: int = 0
    """Requests in flight at the end of the copy (what `auto` settled on, or the fixed number)."""
    throughput_bytes_per_s: float = 0.0
    files_per_s: float = 0.0
    expected_hit_ratio: float = 0.0
    """Share of the window's data/delete bytes that a reader will find in the cache."""
    cache_bytes: int = 0
    budget_bytes: int | None = None
    copied_paths: list[str] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, object]:
        """Every field but the copied paths (asdict would deep-copy thousands of them first)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "copied_paths"}


def qualified_table(settings: Settings, table: str) -> str:
    return table if "." in table else f"{settings.namespace}.{table}"


def plan_cache_items(table: Table, snapshot_id: int, files: Iterable[WindowFile]) -> list[CacheItem]:
    """Everything a reader of the window's `files` at `snapshot_id` opens: table metadata,
    manifest list, manifests, the data files and their delete files (deduplicated, metadata first)."""
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None, "pin_snapshot checked it"
    items: dict[str, CacheItem] = {}
    items[table.metadata_location] = CacheItem(table.metadata_location, None, "metadata")
    items[snapshot.manifest_list] = CacheItem(snapshot.manifest_list, None, "manifest_list")
    for m in snapshot.manifests(table.io):
        items[m.manifest_path] = CacheItem(m.manifest_path, m.manifest_length, "manifest")
    for f in files:
        items[f.path] = CacheItem(f.path, f.size_bytes, "data")
        for d in f.delete_files:
            items.setdefault(d, CacheItem(d, None, "delete"))
    return list(items.values())


def warm_plan(settings: Settings, plan: RunPlan, budget_bytes: int | None = None) -> WarmReport:
    """Warm the cache with exactly the files of a run's plan (`RunPlan.files` at its snapshot,
    into `RunPlan.cache_dir`): what the trainer of that run reads, planned once at render."""
    from slipstream.lake.iceberg import get_catalog
    from slipstream.lake.planning import pin_snapshot

    tbl = get_catalog(settings).load_table(plan.table)
    snap = pin_snapshot(tbl, plan.snapshot_id)
    return _warm_items(settings, tbl, plan.table, snap, plan_cache_items(tbl, snap, plan.files),
                       plan.cache_dir or None, budget_bytes, plan.window)


def warm_window(settings: Settings, table: str, window_days: int, end: datetime, snapshot_id: int | None,
                cache_dir: str | None, budget_bytes: int | None) -> WarmReport:
    """Warm the cache with the window [end - window_days, end) of `table` at `snapshot_id`
    (None: the current snapshot, pinned now). Returns what was copied, kept and evicted."""
    from slipstream.lake.iceberg import get_catalog
    from slipstream.lake.planning import pin_snapshot, plan_window_files, window_bounds

    name = qualified_table(settings, table)
    start, stop = window_bounds(end, window_days)
    tbl = get_catalog(settings).load_table(name)
    snap = pin_snapshot(tbl, snapshot_id)
    items = plan_cache_items(tbl, snap, plan_window_files(tbl, snap, start, stop).files)
    return _warm_items(settings, tbl, name, snap, items, cache_dir, budget_bytes, (start, stop))


def _warm_items(settings: Settings, tbl: Table, name: str, snap: int, items: list[CacheItem], cache_dir: str | None,
                budget_bytes: int | None, window: tuple[datetime, datetime]) -> WarmReport:
    from slipstream.lake.iceberg import s3_io_properties

    cache = CacheSettings.from_env(settings)
    io_props = {**s3_io_properties(settings), **{k: str(v) for k, v in tbl.io.properties.items()}}
    return warm_files(
        cache_dir or cache.dir, items, io_props, table_name=name, snapshot_id=snap,
        budget_bytes=budget_bytes if budget_bytes is not None else cache.budget_bytes,
        knobs=cache.warm, lock_timeout_s=cache.lock_timeout_s, window=window,
    )


def warm_files(cache_dir: str | Path, items: list[CacheItem], io_properties: dict[str, str], *,
               table_name: str, snapshot_id: int | None = None, budget_bytes: int | None = None,
               knobs: WarmKnobs = DEFAULT_KNOBS, lock_timeout_s: float = 600.0,
               window: tuple[datetime, datetime] | None = None) -> WarmReport:
    """Make `items` (a window's files) present in the cache; the building block of `warm_window`,
    also usable with a plain file list (the benchmark's small-file window). `knobs`: how many
    requests in flight, which files are packed into blocks (see `pack.py`), range size, retries."""
    layout = CacheLayout(cache_dir)
    report = WarmReport(table_name, snapshot_id, window[0].isoformat() if window else None,
                        window[1].isoformat() if window else None, str(layout.root), budget_bytes=budget_bytes)
    t0 = time.monotonic()
    items = _with_sizes(items, io_properties)
    by_key = {cache_key(i.remote): i for i in items}
    report.planned_files = len(items)
    report.planned_bytes = sum(i.size or 0 for i in items)
    with cache_lock(layout, lock_timeout_s), CacheIndex(layout) as index:
        report.stale_tmp_removed = clear_tmp(layout.tmp)
        reconcile_blocks(layout, index)
        entries = {e.key: e for e in index.entries_for(table_name, by_key)}
        leaving = out_of_window(entries.values(), table_name, by_key.keys())
        gone = remove_entries(layout, index, leaving)
        for e in leaving:
            del entries[e.key]
        report.evicted_out_of_window = gone.files
        evicted = Evicted(gone.files, gone.bytes)

        cached, missing = _split_cached(layout, index, by_key, entries, table_name, snapshot_id)
        report.already_cached = len(cached)
        report.already_cached_bytes = sum(entries[k].size if k in entries else 0 for k in cached)
        index.mark_planned(cached, table_name, snapshot_id if snapshot_id is not None else -1)

        if budget_bytes is not None:
            missing, lru = _fit_budget(layout, index, by_key, missing, budget_bytes)
            report.evicted_lru = lru.files
            evicted.add(lru)
            report.skipped_over_budget = len(by_key) - len(cached) - len(missing)
        report.evicted, report.evicted_bytes = evicted.files, evicted.bytes

        t_copy = time.monotonic()
        placed, failed, report.concurrency = _copy_all(layout, index, {k: by_key[k] for k in missing}, io_properties,
                                                       table_name, snapshot_id, knobs)
        t_done = time.monotonic()
        report.copied = len(placed)
        report.packed = sum(1 for p in placed if p.block is not None)
        report.blocks = len({p.block for p in placed if p.block is not None})
        report.bytes = sum(p.size for p in placed)
        report.copied_paths = [p.remote for p in placed]
        report.cache_bytes = index.total_bytes()
        key_of = {i.remote: k for k, i in by_key.items()}
        present = {*cached, *(key_of[p.remote] for p in placed)}
    report.seconds = round(time.monotonic() - t0, 3)
    log.debug("warm %s: planned in %.3fs, copied in %.3fs, finished in %.3fs", table_name, t_copy - t0,
              t_done - t_copy, time.monotonic() - t_done)
    report.throughput_bytes_per_s = round(report.bytes / report.seconds, 1) if report.seconds else 0.0
    report.files_per_s = round(report.copied / report.seconds, 1) if report.seconds else 0.0
    data = [(k, i) for k, i in by_key.items() if i.kind in DATA_KINDS]
    total = sum(i.size or 1 for _, i in data)
    report.expected_hit_ratio = round(sum(i.size or 1 for k, i in data if k in present) / total, 4) if total else 1.0
    log.info("warm %s: %s", table_name, report.to_dict())
    if failed:
        names = ", ".join(f"{r} ({e})" for r, e in failed[:5])
        raise CacheWarmError(
            f"{len(failed)} of {len(missing)} files of {table_name} could not be copied into {layout.root}: "
            f"{names}{' ...' if len(failed) > 5 else ''}. {report.copied} were placed and stay cached; "
            "re-run the warmup to copy the rest"
        )
    return report


def _with_sizes(items: list[CacheItem], io_properties: dict[str, str]) -> list[CacheItem]:
    """Ask the store for the sizes Iceberg does not record (table metadata, manifest list, delete
    files: a few HEAD requests), so the budget and the size check cover every file."""
    out = []
    for item in items:
        if item.size is None:
            fs, inner = filesystem_for(item.remote, io_properties)
            info = fs.get_file_info(inner)
            if info.size is not None:
                item = CacheItem(item.remote, int(info.size), item.kind)
        out.append(item)
    return out


def _split_cached(layout: CacheLayout, index: CacheIndex, by_key: dict[str, CacheItem], entries: dict[str, Entry],
                  table_name: str, snapshot_id: int | None) -> tuple[list[str], list[str]]:
    """Which planned files are already whole in the cache. A packed file is cached when its row
    is (`reconcile_blocks` has checked the blocks); a file under files/ is whole by construction,
    and one the index lacks (a reader populated it, or the index write was cut) is adopted when its
    size matches the table metadata."""
    cached: list[str] = []
    missing: list[str] = []
    adopted: list[Entry] = []
    now = time.time()
    files = str(layout.files)
    for key, item in by_key.items():
        entry = entries.get(key)
        if entry is not None and entry.block is not None:
            (cached if item.size is None or entry.size == item.size else missing).append(key)
            continue
        try:
            size = os.stat(f"{files}/{key}").st_size
        except FileNotFoundError:
            missing.append(key)
            continue
        if item.size is not None and size != item.size:
            missing.append(key)  # a different file under the same name: replace it
        elif entry is not None:
            cached.append(key)
        else:
            adopted.append(Entry(key, item.remote, size, None, table_name, snapshot_id, now, now))
            cached.append(key)
    index.put_many(adopted)
    return cached, missing


def _fit_budget(layout: CacheLayout, index: CacheIndex, by_key: dict[str, CacheItem], missing: list[str],
                budget: int) -> tuple[list[str], Evicted]:
    """Evict least-recently-used files outside the window to make room; if the window alone is
    larger than the budget, copy what fits (metadata first, then data in plan order)."""
    entries = index.entries()
    total = index.total_bytes()
    need = sum(by_key[k].size or 0 for k in missing)
    victims = lru_victims(entries, by_key.keys(), total + need - budget, index.blocks()) if total + need > budget else []
    evicted = remove_entries(layout, index, victims)
    room = budget - (total - evicted.bytes)
    keep = []
    for k in missing:
        size = by_key[k].size or 0
        if size <= room:
            keep.append(k)
            room -= size
    if len(keep) < len(missing):
        log.warning("window needs %d more bytes than the cache budget allows: %d files stay remote",
                    need - sum(by_key[k].size or 0 for k in keep), len(missing) - len(keep))
    return keep, evicted


def _copy_all(layout: CacheLayout, index: CacheIndex, missing: dict[str, CacheItem], io_properties: dict[str, str],
              table_name: str, snapshot_id: int | None, knobs: WarmKnobs
              ) -> tuple[list[Placed], list[tuple[str, str]], int]:
    """Copy through a `Transfer` (its threads fetch; this thread sizes the pool, commits and logs).
    Index rows are written as files land, in batches of INDEX_BATCH (a crash loses at most the
    last batch, whose files the next run adopts: whole under files/ by construction), and with
    each block as soon as it is sealed (a block without rows is an orphan the next run deletes).
    Returns (placed, failed, requests in flight at the end)."""
    placed: list[Placed] = []
    failed: list[tuple[str, str]] = []
    todo = list(missing.values())
    if not todo:
        return placed, failed, 0
    key_of = {i.remote: k for k, i in missing.items()}
    requests, large = plan_requests(todo, layout, io_properties, knobs)
    transfer = Transfer(layout, io_properties, knobs, requests, large)
    progress = _Progress(table_name, len(todo), sum(i.size or 0 for i in todo))
    pending_rows: list[tuple[object, ...]] = []
    pending_blocks: list[Block] = []
    transfer.start()
    try:
        got = 0
        while got < len(todo):
            now = time.time()
            batch = drain(transfer, CONTROL_S)
            if not batch and transfer.finished():  # a thread failed and stopped the others
                seen = {p.remote for p in placed} | {r for r, _ in failed}
                failed += [(i.remote, "not copied: the warmup stopped early (see the other errors)")
                           for i in todo if i.remote not in seen]
                break
            for sealed in batch:
                got += len(sealed.placed) + len(sealed.failed)
                for remote, err in sealed.failed:
                    if not isinstance(err, Exception):
                        raise err
                    failed.append((remote, str(err).splitlines()[0][:200]))
                if sealed.block is not None:
                    pending_blocks.append(sealed.block)
                for p in sealed.placed:
                    placed.append(p)
                    pending_rows.append((key_of[p.remote], p.remote, p.size, p.etag, table_name,
                                         snapshot_id, now, now, p.block, p.offset))  # Entry.row() order
            # a sealed block is committed at once: until then it is an orphan that a crash loses
            if len(pending_rows) >= INDEX_BATCH or pending_blocks or (pending_rows and got == len(todo)):
                index.put_rows(pending_rows, blocks=pending_blocks)
                pending_rows, pending_blocks = [], []
            transfer.control()
            progress.log(transfer, len(failed), done=got == len(todo))
    finally:
        transfer.close()
        if pending_rows:  # an interrupted run still records what landed
            index.put_rows(pending_rows, blocks=pending_blocks)
    return placed, failed, transfer.target


class _Progress:
    """The warmup's progress line, every PROGRESS_EVERY_S and at the end: files and bytes fetched,
    rates, requests in flight, ETA."""

    def __init__(self, table_name: str, files: int, total_bytes: int) -> None:
        self.table_name, self.files, self.total_bytes = table_name, files, total_bytes
        self.t0 = self.last = time.monotonic()

    def log(self, transfer: Transfer, failed: int, *, done: bool) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_S and not done:
            return
        self.last = now
        totals = transfer.clock.totals()
        files, nbytes = totals.files, totals.bytes
        elapsed = max(now - self.t0, 1e-6)
        rate, file_rate = nbytes / elapsed, files / elapsed
        left = ((self.total_bytes - nbytes) / rate if rate and self.total_bytes
                else (self.files - files) / file_rate if file_rate else float("nan"))
        log.info("warm %s: %d/%d files, %.1f/%.1f MB, %.1f MB/s, %.0f files/s, %d requests in flight, ETA %.0fs%s",
                 self.table_name, files, self.files, nbytes / 1e6, self.total_bytes / 1e6, rate / 1e6,
                 file_rate, transfer.target, max(0.0, left), f", {failed} failed" if failed else "")
