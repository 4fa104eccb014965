"""The cache's on-disk layout, its index and its lock.

```
<cache_dir>/files/<scheme>/<bucket or path>/...   complete copies only (placed by atomic rename)
<cache_dir>/blocks/<name>.blk                     small files packed end to end (complete blocks only)
<cache_dir>/tmp/                                  copies in flight (`*.part`); cleared by the next warmup
<cache_dir>/index.sqlite                          one row per cached file: remote path, size, snapshot,
                                                  last access, and for a packed file its block and offset
<cache_dir>/index.gen                             8-byte counter bumped after every index commit (readers
                                                  map it: a change tells them to reload, no query per read)
<cache_dir>/warm.lock                             flock held by a warmup; holds the holder's PID
```

A file under `files/` is complete by construction (it appears only through `os.replace` after
its size and checksum were verified), so a reader needs no index lookup to know such a hit: it
checks that the file exists. A packed file is known only through the index: its row is committed
after its block was verified and renamed into `blocks/`, and a block is deleted only after its
rows, so a row always points at complete bytes. Blocks are never rewritten (a name is used once).
The index is also the warmup's record of what to copy and evict, and what `status` shows.
SQLite in WAL mode lets readers record access times while a warmup writes.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from slipstream.cache.remote import cache_key
from slipstream.errors import CacheBusy

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,      -- path under files/
    remote TEXT NOT NULL,      -- the warehouse path it mirrors
    size INTEGER NOT NULL,
    etag TEXT,                 -- checksum the store gave (S3 ETag), when any
    table_name TEXT,           -- Iceberg table whose window planned it (NULL: populated by a reader)
    snapshot INTEGER,          -- snapshot of the last warmup that planned it
    added REAL NOT NULL,
    last_access REAL NOT NULL,
    block TEXT,                -- the block holding a packed file (NULL: a file of its own under files/)
    block_offset INTEGER       -- where the packed file starts in its block
);
CREATE TABLE IF NOT EXISTS blocks (
    name TEXT PRIMARY KEY,     -- file name under blocks/
    size INTEGER NOT NULL,     -- bytes on disk, members that left the index included
    added REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_block ON entries(block) WHERE block IS NOT NULL;
"""
_COLUMNS = "key, remote, size, etag, table_name, snapshot, added, last_access, block, block_offset"


class CacheLayout:
    def __init__(self, cache_dir: str | Path) -> None:
        self.root = Path(cache_dir).resolve()
        self.files = self.root / "files"
        self.blocks = self.root / "blocks"
        self.tmp = self.root / "tmp"
        self.index_path = self.root / "index.sqlite"
        self.generation_path = self.root / "index.gen"
        self.lock_path = self.root / "warm.lock"

    def ensure(self) -> None:
        self.files.mkdir(parents=True, exist_ok=True)
        self.blocks.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def local_path(self, remote: str) -> Path:
        return self.files / cache_key(remote)

    def block_path(self, name: str) -> Path:
        return self.blocks / name


@dataclass(frozen=True)
class Entry:
    key: str
    remote: str
    size: int
    etag: str | None
    table_name: str | None
    snapshot: int | None
    added: float
    last_access: float
    block: str | None = None
    """The block that holds this file (packed), or None (a file of its own under files/)."""
    block_offset: int | None = None

    def row(self) -> tuple[object, ...]:
        return (self.key, self.remote, self.size, self.etag, self.table_name, self.snapshot, self.added,
                self.last_access, self.block, self.block_offset)


class Generation:
    """The index's change counter, memory-mapped: `bump()` after a commit, `value()` costs a
    memory read (a reader checks it on every lookup; SQLite's `PRAGMA data_version` is a query)."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < 8:
                os.ftruncate(fd, 8)
            self.map = mmap.mmap(fd, 8)
        finally:
            os.close(fd)

    def value(self) -> int:
        return int.from_bytes(self.map[:8], "little")

    def bump(self) -> None:
        """Any change of the value tells readers to reload (a lost update between two writers
        still changes it)."""
        self.map[:8] = ((self.value() + 1) % (1 << 64)).to_bytes(8, "little")

    def close(self) -> None:
        self.map.close()


@dataclass(frozen=True)
class Block:
    name: str
    size: int
    added: float


class CacheIndex:
    """One SQLite connection to `<cache_dir>/index.sqlite`: use it from one thread, or (with
    `any_thread=True`) from several under the caller's own lock."""

    def __init__(self, layout: CacheLayout, *, any_thread: bool = False) -> None:
        layout.ensure()
        self.layout = layout
        self.db = sqlite3.connect(layout.index_path, timeout=30.0, isolation_level=None,
                                  check_same_thread=not any_thread)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.generation = Generation(layout.generation_path)
        columns = {r[1] for r in self.db.execute("PRAGMA table_info(entries)")}
        if columns and "block" not in columns:  # an index written before packing existed
            with self.transaction():
                if "block" not in {r[1] for r in self.db.execute("PRAGMA table_info(entries)")}:
                    self.db.execute("ALTER TABLE entries ADD COLUMN block TEXT")
                    self.db.execute("ALTER TABLE entries ADD COLUMN block_offset INTEGER")
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()
        self.generation.close()

    def __enter__(self) -> CacheIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def entries(self) -> list[Entry]:
        return [Entry(*r) for r in self.db.execute(f"SELECT {_COLUMNS} FROM entries")]

    def entries_for(self, table_name: str, keys: Iterable[str]) -> list[Entry]:
        """The rows a warmup of `table_name` needs: that table's (what may leave its window) and
        those of the planned `keys`, without reading the whole index."""
        self.db.execute("CREATE TEMP TABLE IF NOT EXISTS planned (key TEXT PRIMARY KEY)")
        with self.transaction(bump=False):
            self.db.execute("DELETE FROM planned")
            self.db.executemany("INSERT OR IGNORE INTO planned VALUES (?)", ((k,) for k in keys))
        rows = self.db.execute(f"SELECT {_COLUMNS} FROM entries WHERE table_name = ? "
                               "OR key IN (SELECT key FROM planned)", (table_name,))
        return [Entry(*r) for r in rows]

    def get(self, key: str) -> Entry | None:
        row = self.db.execute(f"SELECT {_COLUMNS} FROM entries WHERE key=?", (key,)).fetchone()
        return Entry(*row) if row else None

    def blocks(self) -> list[Block]:
        return [Block(*r) for r in self.db.execute("SELECT name, size, added FROM blocks")]

    def packed(self) -> dict[str, tuple[str, str, int, int]]:
        """{remote path: (key, block, offset, size)} of every packed file (what a reader serves
        from blocks)."""
        rows = self.db.execute("SELECT remote, key, block, block_offset, size FROM entries WHERE block IS NOT NULL")
        return {r: (k, b, o, n) for r, k, b, o, n in rows}

    def put(self, entry: Entry, *, replace: bool = True) -> None:
        self.put_many([entry], replace=replace)

    def put_many(self, entries: Iterable[Entry], *, replace: bool = True, blocks: Iterable[Block] = ()) -> None:
        """Insert rows in one transaction, with the blocks that hold packed ones (a block and its
        members become visible to readers together)."""
        self.put_rows([e.row() for e in entries], replace=replace, blocks=blocks)

    def put_rows(self, rows: Iterable[tuple[object, ...]], *, replace: bool = True, blocks: Iterable[Block] = ()) -> None:
        """`put_many` with rows in `Entry.row()` order (the warmup builds thousands: no object each)."""
        with self.transaction():
            self.db.executemany("INSERT OR REPLACE INTO blocks VALUES (?, ?, ?)",
                                [(b.name, b.size, b.added) for b in blocks])
            self.db.executemany(
                f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    def mark_planned(self, keys: Iterable[str], table_name: str, snapshot: int) -> None:
        """Files already cached that this warmup planned again now belong to its snapshot."""
        with self.transaction():
            self.db.executemany(
                "UPDATE entries SET table_name=?, snapshot=? WHERE key=?",
                [(table_name, snapshot, k) for k in keys],
            )

    def touch(self, accesses: dict[str, float]) -> None:
        """Record last-access times (reader hits); unknown keys are ignored."""
        if accesses:
            with self.transaction():
                self.db.executemany(
                    "UPDATE entries SET last_access=MAX(last_access, ?) WHERE key=?",
                    [(t, k) for k, t in accesses.items()],
                )

    def remove(self, keys: Iterable[str]) -> list[Block]:
        """Delete rows; returns the blocks left without members, whose rows go in the same
        transaction (the caller deletes their files after it: readers see no row first)."""
        with self.transaction():
            self.db.executemany("DELETE FROM entries WHERE key=?", [(k,) for k in keys])
            empty = [Block(*r) for r in self.db.execute(
                "SELECT name, size, added FROM blocks WHERE name NOT IN "
                "(SELECT DISTINCT block FROM entries WHERE block IS NOT NULL)")]
            self.db.executemany("DELETE FROM blocks WHERE name=?", [(b.name,) for b in empty])
        return empty

    def total_bytes(self) -> int:
        """Bytes on disk: files of their own plus whole blocks."""
        loose = self.db.execute("SELECT COALESCE(SUM(size), 0) FROM entries WHERE block IS NULL").fetchone()[0]
        packed = self.db.execute("SELECT COALESCE(SUM(size), 0) FROM blocks").fetchone()[0]
        return int(loose) + int(packed)

    @contextmanager
    def transaction(self, *, bump: bool = True) -> Iterator[None]:
        """A write transaction; readers are told by the generation counter (`bump`: False for a
        change only this connection sees, a temporary table)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        if bump:
            self.generation.bump()


@contextmanager
def cache_lock(layout: CacheLayout, timeout_s: float) -> Iterator[None]:
    """Exclusive lock for a warmup/eviction on this cache (flock: released if the holder dies)."""
    layout.ensure()
    fd = os.open(layout.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                    raise CacheBusy(
                        f"another warmup (pid {holder}) holds {layout.lock_path} for over {timeout_s:.0f}s: "
                        "wait for it, or raise SLIPSTREAM_CACHE_LOCK_TIMEOUT_S"
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
