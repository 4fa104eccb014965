"""Eviction: drop files that left the window, then least-recently-used ones, under a budget.

Deleting a cached file is safe while a reader has it open (POSIX keeps the inode until it is
closed); a reader that looks it up after the delete sees a miss and reads remote.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from slipstream.cache.index import CacheIndex, CacheLayout, Entry, cache_lock

log = logging.getLogger(__name__)


@dataclass
class Evicted:
    files: int = 0
    bytes: int = 0

    def add(self, other: "Evicted") -> None:
        self.files += other.files
        self.bytes += other.bytes


def remove_entries(layout: CacheLayout, index: CacheIndex, entries: Iterable[Entry]) -> Evicted:
    """Delete the files and their index rows (call under the cache lock)."""
    out = Evicted()
    keys = []
    for e in entries:
        (layout.files / e.key).unlink(missing_ok=True)
        keys.append(e.key)
        out.files += 1
        out.bytes += e.size
    index.remove(keys)
    _prune_empty_parents(layout.files, {(layout.files / k).parent for k in keys})
    return out


def out_of_window(entries: Iterable[Entry], table_name: str, window_keys: Collection[str]) -> list[Entry]:
    """Entries this table's earlier warmups placed that the current window no longer needs."""
    return [e for e in entries if e.table_name == table_name and e.key not in window_keys]


def lru_victims(entries: Iterable[Entry], protected: Collection[str], bytes_to_free: int) -> list[Entry]:
    """Least recently accessed unprotected entries, oldest first, until `bytes_to_free` is covered."""
    victims: list[Entry] = []
    freed = 0
    for e in sorted((e for e in entries if e.key not in protected), key=lambda e: (e.last_access, e.key)):
        if freed >= bytes_to_free:
            break
        victims.append(e)
        freed += e.size
    return victims


def evict_cache(cache_dir: str | Path, *, table_name: str | None = None, keep_bytes: int | None = None,
                lock_timeout_s: float = 600.0) -> Evicted:
    """`slipstream cache evict`: drop a table's files (or all when table_name is None and
    keep_bytes is None), or LRU files until at most `keep_bytes` remain."""
    layout = CacheLayout(cache_dir)
    with cache_lock(layout, lock_timeout_s), CacheIndex(layout) as index:
        entries = index.entries()
        if keep_bytes is not None:
            pool = [e for e in entries if table_name is None or e.table_name == table_name]
            total = sum(e.size for e in entries)
            victims = lru_victims(pool, (), max(0, total - keep_bytes))
        else:
            victims = [e for e in entries if table_name is None or e.table_name == table_name]
        out = remove_entries(layout, index, victims)
    log.info("evicted %d files (%.1f MB) from %s", out.files, out.bytes / 1e6, layout.root)
    return out


def _prune_empty_parents(root: Path, dirs: set[Path]) -> None:
    """Remove folders the eviction emptied, deepest first, never `root` itself."""
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        while d != root and root in d.parents:
            try:
                d.rmdir()
            except OSError:  # not empty (or already gone): its parents are not empty either
                break
            d = d.parent
