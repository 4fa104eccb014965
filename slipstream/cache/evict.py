"""Eviction: drop files that left the window, then least-recently-used ones, under a budget.

Deleting a cached file is safe while a reader has it open (POSIX keeps the inode until it is
closed); a reader that looks it up after the delete sees a miss and reads remote.

A block of packed files is one unit for the least-recently-used order (its last access is its
members' latest; its size is the block file's): it frees space only as a whole. A packed file that
leaves the window loses its index row at once (readers miss it); the block file goes with its
last member.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from slipstream.cache.index import Block, CacheIndex, CacheLayout, Entry, cache_lock

log = logging.getLogger(__name__)


@dataclass
class Evicted:
    files: int = 0
    bytes: int = 0

    def add(self, other: Evicted) -> None:
        self.files += other.files
        self.bytes += other.bytes


def remove_entries(layout: CacheLayout, index: CacheIndex, entries: Iterable[Entry]) -> Evicted:
    """Delete the index rows, then the files of their own and the blocks left without members
    (call under the cache lock). `bytes` counts what was freed on disk."""
    out = Evicted()
    keys = []
    loose = []
    for e in entries:
        keys.append(e.key)
        out.files += 1
        if e.block is None:
            loose.append(e.key)
            out.bytes += e.size
    emptied = index.remove(keys)  # readers stop finding packed files before their block goes
    for k in loose:
        (layout.files / k).unlink(missing_ok=True)
    for b in emptied:
        layout.block_path(b.name).unlink(missing_ok=True)
        out.bytes += b.size
    _prune_empty_parents(layout.files, {(layout.files / k).parent for k in loose})
    return out


def out_of_window(entries: Iterable[Entry], table_name: str, window_keys: Collection[str]) -> list[Entry]:
    """Entries this table's earlier warmups placed that the current window no longer needs."""
    return [e for e in entries if e.table_name == table_name and e.key not in window_keys]


def lru_victims(entries: Iterable[Entry], protected: Collection[str], bytes_to_free: int,
                blocks: Iterable[Block] = ()) -> list[Entry]:
    """Least recently accessed units (a file of its own, or a whole block) holding no protected
    file, oldest first, until `bytes_to_free` is covered; returns their entries."""
    block_size = {b.name: b.size for b in blocks}
    units: dict[str, list[Entry]] = {}
    for e in entries:
        units.setdefault(f"block:{e.block}" if e.block is not None else e.key, []).append(e)
    candidates = []
    for name, members in units.items():
        if any(m.key in protected for m in members):
            continue
        block = members[0].block
        size = block_size.get(block, sum(m.size for m in members)) if block is not None else members[0].size
        candidates.append((max(m.last_access for m in members), name, size, members))
    victims: list[Entry] = []
    freed = 0
    for _, _, size, members in sorted(candidates, key=lambda c: (c[0], c[1])):
        if freed >= bytes_to_free:
            break
        victims.extend(members)
        freed += size
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
            total = index.total_bytes()
            victims = lru_victims(pool, (), max(0, total - keep_bytes), index.blocks())
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
