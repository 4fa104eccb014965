"""The cache's on-disk layout, its index and its lock.

```
<cache_dir>/files/<scheme>/<bucket or path>/...   complete copies only (placed by atomic rename)
<cache_dir>/tmp/                                  copies in flight (`*.part`); cleared by the next warmup
<cache_dir>/index.sqlite                          one row per cached file: remote path, size, snapshot, last access
<cache_dir>/warm.lock                             flock held by a warmup; holds the holder's PID
```

A file under `files/` is complete by construction (it appears only through `os.replace` after
its size and checksum were verified), so a reader needs no index lookup to know a hit: it checks
that the file exists. The index is for the warmup (what to copy, what to evict) and for `status`.
SQLite in WAL mode lets readers record access times while a warmup writes.
"""

from __future__ import annotations

import fcntl
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
    last_access REAL NOT NULL
)
"""


class CacheLayout:
    def __init__(self, cache_dir: str | Path) -> None:
        self.root = Path(cache_dir).resolve()
        self.files = self.root / "files"
        self.tmp = self.root / "tmp"
        self.index_path = self.root / "index.sqlite"
        self.lock_path = self.root / "warm.lock"

    def ensure(self) -> None:
        self.files.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def local_path(self, remote: str) -> Path:
        return self.files / cache_key(remote)


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


class CacheIndex:
    """One SQLite connection to `<cache_dir>/index.sqlite` (use from one thread)."""

    def __init__(self, layout: CacheLayout) -> None:
        layout.ensure()
        self.layout = layout
        self.db = sqlite3.connect(layout.index_path, timeout=30.0, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "CacheIndex":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def entries(self) -> list[Entry]:
        rows = self.db.execute(
            "SELECT key, remote, size, etag, table_name, snapshot, added, last_access FROM entries"
        ).fetchall()
        return [Entry(*r) for r in rows]

    def get(self, key: str) -> Entry | None:
        row = self.db.execute(
            "SELECT key, remote, size, etag, table_name, snapshot, added, last_access FROM entries WHERE key=?",
            (key,),
        ).fetchone()
        return Entry(*row) if row else None

    def put(self, entry: Entry, *, replace: bool = True) -> None:
        self.db.execute(
            f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (entry.key, entry.remote, entry.size, entry.etag, entry.table_name, entry.snapshot,
             entry.added, entry.last_access),
        )

    def put_many(self, entries: Iterable[Entry], *, replace: bool = True) -> None:
        with self.transaction():
            self.db.executemany(
                f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(e.key, e.remote, e.size, e.etag, e.table_name, e.snapshot, e.added, e.last_access)
                 for e in entries],
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

    def remove(self, keys: Iterable[str]) -> None:
        with self.transaction():
            self.db.executemany("DELETE FROM entries WHERE key=?", [(k,) for k in keys])

    def total_bytes(self) -> int:
        return int(self.db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0])

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")


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
