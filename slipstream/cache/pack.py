"""Pack many small files into a few cache blocks.

A window of thousands of small files (the Weibo case; the files streaming commits produce) costs
the node a create, a rename and an inode per file on the way in, and an open per file on every
read. Files below `pack_below` bytes are instead appended end to end into block files.

Each copy thread fills a block of its own: it appends the next small file (in path order) until
the block holds `block_bytes` or the next file is from another folder, then seals it and starts
the next, so every thread stays busy to the end and consecutive files of one folder (a day
partition) share blocks, which therefore leave the cache with their day.

A block is built like a single file, so a reader never sees partial data: members are fetched one
after the other into `tmp/w-<random>.part`, each verified (size from the table metadata, the ETag
when the store gives a checkable one; a member that keeps failing is cut off again and reported),
the block is renamed into `blocks/<random>.blk`, and only then are the block and its members'
rows (block, offset, size) committed to the index, which is where readers look packed files up.
A block renamed but never committed (the warmup died in between) is an orphan that
`reconcile_blocks` deletes under the next warmup's lock; a block still being filled is a `.part`
that the next warmup deletes.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from slipstream.cache.copy import Placed, fetcher, md5_for, no_hash, verify_copy, write_all
from slipstream.cache.index import Block, CacheIndex, CacheLayout
from slipstream.cache.remote import etag_matches
from slipstream.cache.s3get import getter_for
from slipstream.errors import CacheError

log = logging.getLogger(__name__)

PACK_BELOW = 128 << 10
"""Default: files smaller than this are packed (`SLIPSTREAM_CACHE_PACK_BELOW`)."""
PACK_MIN_FILES = 32
"""A warmup with fewer small files than this places them as files of their own."""
BLOCK_BYTES = 16 << 20
"""Default: a block is sealed at this size (`SLIPSTREAM_CACHE_BLOCK_BYTES`)."""
FLUSH_BYTES = 1 << 20
BLOCK_SUFFIX = ".blk"

T = TypeVar("T")


class Sized(Protocol):
    @property
    def remote(self) -> str: ...
    @property
    def size(self) -> int | None: ...


S = TypeVar("S", bound=Sized)


class Attempt(Protocol):
    """attempt(remote, fn): run fn with the warmup's retries of transient errors."""

    def __call__(self, remote: str, fn: Callable[[], T], /) -> T: ...


def plan_packing(items: Sequence[S], pack_below: int) -> tuple[list[S], list[S]]:
    """(files to pack, sorted by path; files to place on their own). Nothing is packed when there
    are fewer than PACK_MIN_FILES small files: a few files gain nothing from blocks."""
    small = sorted((i for i in items if i.size is not None and i.size < pack_below), key=lambda i: i.remote)
    if len(small) < PACK_MIN_FILES:
        return [], list(items)
    packed = {id(i) for i in small}
    return small, [i for i in items if id(i) not in packed]


@dataclass
class SealedBlock:
    block: Block | None
    """None when no member could be fetched (nothing was placed)."""
    placed: list[Placed]
    failed: list[tuple[str, BaseException]]


_WRITES = threading.Lock()
"""One block write at a time per process: ext4 took twice the CPU per megabyte with 64 threads
writing their own files at once than with one (its journal and allocator locks); a write of
FLUSH_BYTES takes a fraction of a millisecond, so threads rarely wait (docs/cache.md)."""


def _buffer(size: int) -> memoryview:
    """A new block buffer, its pages mapped in one call (MAP_POPULATE). A zero-filled bytearray
    faulted its pages in one by one, which showed among the largest costs a warmup added to a GET
    of the same files (docs/cache.md)."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return memoryview(mmap.mmap(-1, size, flags=flags))


class BufferPool:
    """Block buffers kept for the next block, of this warmup or of the next one in the process:
    mapping and zeroing a fresh megabyte for each thread of each warmup was, after the bytes
    themselves, the largest cost a warmup added to GETs of the same files (docs/cache.md). At most
    `keep_bytes` are kept; buffers beyond that are unmapped when given back."""

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self._free: list[memoryview] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> memoryview:
        with self._lock:
            for i, buf in enumerate(self._free):
                if len(buf) >= size:
                    return self._free.pop(i)
        return _buffer(size)

    def give(self, buf: memoryview) -> None:
        with self._lock:
            if len(buf) + sum(len(b) for b in self._free) <= self.keep_bytes:
                self._free.append(buf)

    def kept_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._free)


BUFFERS = BufferPool(keep_bytes=160 << 20)
"""The process's block buffers (160 MiB: 128 threads' worth at the default sizes)."""

_NAME_PREFIX = uuid.uuid4().hex[:16]
_NAME_COUNTER = itertools.count()


def _fresh_name_state() -> None:
    global _NAME_PREFIX, _NAME_COUNTER
    _NAME_PREFIX, _NAME_COUNTER = uuid.uuid4().hex[:16], itertools.count()


os.register_at_fork(after_in_child=_fresh_name_state)  # a forked process must not repeat its parent's names


def unique_name() -> str:
    """A name no other block or temporary file of any process takes: a random prefix per
    process and a counter (two `uuid4` calls per block showed in the profile: each reads
    /dev/urandom)."""
    return f"{_NAME_PREFIX}{next(_NAME_COUNTER):08x}"


class BlockWriter:
    """One block being filled by one thread: `append` members, then `seal` (or `abort`). Members
    are read straight into a buffer (with the one-GET client: from the socket into their place,
    no copy in between) and written out about every FLUSH_BYTES (a write per file showed in the
    profile), always between members, so a failed member is simply dropped from the buffer."""

    def __init__(self, layout: CacheLayout, io_properties: dict[str, str], attempt: Attempt, *,
                 block_bytes: int = BLOCK_BYTES, max_member: int = PACK_BELOW, buffer: memoryview | None = None,
                 verify_etag: bool = True) -> None:
        self.getter = getter_for(io_properties)
        self.fetch = fetcher(io_properties, verify_etag)
        self.hasher_for = md5_for if verify_etag else no_hash
        self.attempt = attempt
        self.block_bytes = block_bytes
        self.name = f"{unique_name()}{BLOCK_SUFFIX}"
        self.path = layout.block_path(self.name)
        self.tmp = layout.tmp / f"w-{self.name}.part"
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.folder: str | None = None
        self.written = 0
        """Bytes of the block already written to its file."""
        size = FLUSH_BYTES + max_member + 1
        if buffer is not None and len(buffer) < size:
            BUFFERS.give(buffer)
            buffer = None
        self.buffer = buffer if buffer is not None else BUFFERS.take(size)
        """Reused from the thread's previous block, or from the pool; the last writer of a thread
        gives it back to `BUFFERS` (`release`)."""
        self.fill = 0
        """Bytes of the buffer in use: the block's tail, from `written`."""
        self.members: list[str] = []
        self.placed: list[Placed] = []
        self.failed: list[tuple[str, BaseException]] = []

    @property
    def offset(self) -> int:
        """Bytes of the members placed so far (the block's size once flushed)."""
        return self.written + self.fill

    def accepts(self, folder: str) -> bool:
        """Whether a file of `folder` belongs in this block: same folder, and the block is not full yet."""
        return self.folder in (None, folder) and self.offset < self.block_bytes

    def append(self, remote: str, expected_size: int, folder: str) -> None:
        """Fetch `remote` (in `folder`, its parent) onto the end of the block and verify it; a file
        that keeps failing is dropped again and reported by `seal`."""
        self.folder = folder
        self.members.append(remote)
        start = self.fill
        room = self.buffer[start:start + expected_size + 1]  # +1: a longer file shows as such
        try:
            size, etag = self.attempt(remote, lambda: self._fetch(remote, expected_size, room))
        except Exception as e:  # noqa: BLE001 - reported with the file's name; the block goes on
            self.failed.append((remote, e))
            return
        self.placed.append(Placed(remote, self.path, size, etag, self.name, self.written + start))
        self.fill = start + size
        if self.fill >= FLUSH_BYTES:
            self._flush()

    def _fetch(self, remote: str, expected_size: int, room: memoryview) -> tuple[int, str | None]:
        if self.getter is not None and remote.startswith("s3://"):
            size, etag, md5 = self.getter.get_into(remote[5:], room, self.hasher_for)
            checked = etag_matches(etag, md5) if etag and md5 is not None else None
        else:
            got = bytearray()
            size, etag, checked = self.fetch(remote, got.extend, expected_size)
            room[:min(size, len(room))] = got[:len(room)]
        verify_copy(remote, size, expected_size, etag, checked)
        return size, etag

    def seal(self) -> SealedBlock:
        """Rename the complete block into `blocks/` (the caller then commits its index rows)."""
        try:
            self._flush()
            os.close(self.fd)
            self.fd = -1
            if not self.placed:
                self.tmp.unlink()
                return SealedBlock(None, [], self.failed)
            on_disk = self.tmp.stat().st_size
            if on_disk != self.offset:
                raise CacheError(f"block {self.tmp} has {on_disk} bytes but its members add up to {self.offset}; "
                                 "re-run the warmup")
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return SealedBlock(Block(self.name, self.offset, time.time()), self.placed, self.failed)

    def release(self) -> None:
        """Give the buffer back to the pool (after `seal` or `abort`: the writer is done)."""
        BUFFERS.give(self.buffer)

    def abort(self) -> None:
        """Drop the unfinished block (nothing of it was visible)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.tmp.unlink(missing_ok=True)

    def _flush(self) -> None:
        if self.fill:
            with _WRITES:
                write_all(self.fd, self.buffer[:self.fill])
            self.written += self.fill
            self.fill = 0


def reconcile_blocks(layout: CacheLayout, index: CacheIndex) -> int:
    """Under the cache lock: delete block files the index does not know (a warmup died between the
    rename and the commit) and forget blocks whose file is gone. Returns how many were dropped."""
    known = {b.name for b in index.blocks()}
    on_disk = {p.name for p in layout.blocks.glob(f"*{BLOCK_SUFFIX}")} if layout.blocks.exists() else set()
    for name in on_disk - known:
        layout.block_path(name).unlink(missing_ok=True)
    lost = known - on_disk
    if lost:
        log.warning("%d cache blocks vanished from %s: their files will be copied again", len(lost), layout.blocks)
        index.remove(e.key for e in index.entries() if e.block in lost)
    return len(on_disk - known) + len(lost)
