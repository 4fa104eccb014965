"""Cache-aware reads for the trainer and the quality step.

```python
reader = CacheReader(settings.cache_dir, s3_io_properties(settings))
table = reader.read_row_group("s3://warehouse/wh/.../data/00000.parquet", 3, ["label", "f_0"])
with reader.open_input_file(path) as f: ...      # a pyarrow NativeFile: local copy or remote
reader.stats()  # {"hits", "misses", "bytes_local", "bytes_remote", "hit_ratio"}
```

A hit is a packed file the index lists in a block under `<cache_dir>/blocks/` (served as a
zero-copy slice of the memory-mapped block, see `pack.py`) or a file under `<cache_dir>/files/`
(complete by construction, see `copy.py`); a miss reads the remote file and, with `populate=True`,
copies it into the cache first (atomically) so the next read hits. The reader keeps the index's
map of packed files and reloads it whenever the index changed (its generation counter, a
memory-mapped word every commit bumps, checked on every lookup), so a file evicted or packed
meanwhile is seen as such. Byte counters: `open_input_file` counts the file's size; `read_row_group` counts the
compressed bytes of the column chunks it reads. Thread-safe; one reader per process is enough.
Access times are kept in memory and written to the index by `flush()` (also on `close()`), which
is what the warmup's least-recently-used eviction orders by.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from slipstream.cache.copy import copy_atomic
from slipstream.cache.index import CacheIndex, CacheLayout, Entry
from slipstream.cache.remote import cache_key, filesystem_for

log = logging.getLogger(__name__)

FOOTER_CACHE = 256


class CacheReader:
    def __init__(self, cache_dir: str, io_properties: dict[str, str], *, populate: bool = False) -> None:
        self.layout = CacheLayout(cache_dir)
        self.io_properties = dict(io_properties)
        self.populate = populate
        self._lock = threading.Lock()
        self._stats = {"hits": 0, "misses": 0, "bytes_local": 0, "bytes_remote": 0, "populated": 0}
        self._accesses: dict[str, float] = {}
        self._populated: list[Entry] = []
        self._footers: dict[str, pq.FileMetaData] = {}
        self._index: CacheIndex | None = None
        self._index_pid = 0
        self._generation = -1
        self._packed: dict[str, tuple[str, str, int, int]] = {}
        """{remote path: (key, block, offset, size)}, as the index had it at `_generation`."""
        self._packed_keys: dict[str, tuple[str, str, int, int]] = {}
        """The same by cache key (a path spelled differently, e.g. s3a://, names the same file)."""
        self._blocks: dict[str, pa.Buffer] = {}
        """Memory-mapped blocks, whole (a slice of one is zero-copy)."""

    # -- lookups ---------------------------------------------------------------------------
    def local_path(self, path: str) -> str | None:
        """The cached copy of `path` when it is a file of its own, or None (not cached, or packed
        into a block: `open_input_file` serves both)."""
        local = self.layout.local_path(path)
        return str(local) if local.is_file() else None

    def _current_packed(self) -> dict[str, tuple[str, str, int, int]] | None:
        """The map of packed files, reloaded when the index's generation moved (None: no index)."""
        index = self._index
        if index is not None and self._index_pid == os.getpid() and index.generation.value() == self._generation:
            return self._packed
        with self._lock:
            if self._index is None or self._index_pid != os.getpid():  # a forked child opens its own
                if not self.layout.index_path.exists():
                    return None
                self._index = CacheIndex(self.layout, any_thread=True)
                self._index_pid = os.getpid()
                self._generation = -1
            generation = self._index.generation.value()  # read before the rows: a later commit bumps it again
            if generation != self._generation:
                packed = self._index.packed()
                live = {b for _, b, _, _ in packed.values()}
                # a block evicted meanwhile: let it go (slices handed out keep its mapping alive)
                self._blocks = {b: m for b, m in self._blocks.items() if b in live}
                self._packed, self._packed_keys = packed, {v[0]: v for v in packed.values()}
                self._generation = generation
            return self._packed

    def _packed_slice(self, path: str, key: str | None = None) -> pa.Buffer | None:
        """The bytes of a packed file (a slice of its memory-mapped block), or None."""
        packed = self._current_packed()
        if packed is None:
            return None
        where = packed.get(path) or self._packed_keys.get(key or cache_key(path))
        if where is None:
            return None
        key, block, offset, size = where
        mapped = self._blocks.get(block)
        if mapped is None:
            try:
                with pa.memory_map(str(self.layout.block_path(block)), "r") as mm:
                    mapped = self._blocks[block] = mm.read_buffer()  # the mapping outlives the file object
            except FileNotFoundError:  # deleted after the map was read: a miss
                return None
        self._accesses[key] = time.time()
        return mapped.slice(offset, size)

    def _open(self, path: str) -> tuple[pa.NativeFile, bool]:
        packed = self._packed_slice(path)
        if packed is not None:
            return pa.BufferReader(packed), True
        key = cache_key(path)
        local = self.layout.files / key
        try:
            f = pa.memory_map(str(local), "r")
        except FileNotFoundError:
            pass
        else:
            self._accesses[key] = time.time()
            return f, True
        if self.populate and self._populate(path):
            try:  # the bytes came from remote: still a miss, but the next read hits
                return pa.memory_map(str(local), "r"), False
            except FileNotFoundError:  # evicted in between: read remote
                pass
        fs, inner = filesystem_for(path, self.io_properties)
        return fs.open_input_file(inner), False

    def _populate(self, path: str) -> bool:
        self.layout.ensure()
        try:
            placed = copy_atomic(path, self.layout.local_path(path), self.layout.tmp, self.io_properties,
                                 tmp_prefix="r-")
        except Exception as e:  # noqa: BLE001 - a failed populate is a plain miss
            log.warning("could not populate the cache with %s: %s", path, e)
            return False
        now = time.time()
        with self._lock:
            self._stats["populated"] += 1
            self._populated.append(Entry(cache_key(path), path, placed.size, placed.etag, None, None, now, now))
        return True

    def _count(self, hit: bool, nbytes: int) -> None:
        with self._lock:
            self._stats["hits" if hit else "misses"] += 1
            self._stats["bytes_local" if hit else "bytes_remote"] += nbytes

    # -- the API ---------------------------------------------------------------------------
    def open_input_file(self, path: str) -> pa.NativeFile:
        """A random-access pyarrow file: the local copy on a hit (memory-mapped), remote on a miss."""
        f, hit = self._open(path)
        self._count(hit, f.size())
        return f

    def read_row_group(self, path: str, row_group: int, columns: Sequence[str] | None = None) -> pa.Table:
        """One (file, row group) work unit through the cache."""
        f, hit = self._open(path)
        with f:
            with self._lock:
                meta = self._footers.get(path)
            pf = pq.ParquetFile(f, metadata=meta)  # reuse the footer: one parse per file, not per row group
            if meta is None:
                with self._lock:
                    if len(self._footers) >= FOOTER_CACHE:
                        self._footers.pop(next(iter(self._footers)))
                    self._footers[path] = pf.metadata
            table = pf.read_row_group(row_group, columns=list(columns) if columns is not None else None)
            rg = pf.metadata.row_group(row_group)
            wanted = set(columns) if columns is not None else None
            nbytes = sum(
                rg.column(i).total_compressed_size for i in range(rg.num_columns)
                if wanted is None or rg.column(i).path_in_schema.split(".")[0] in wanted
            )
        self._count(hit, nbytes)
        return table

    def read_file(self, path: str) -> bytes:
        """The whole file's bytes (small files, benchmarks). A plain miss streams the object with
        one GET (no size request first)."""
        packed = self._packed_slice(path)
        if packed is not None:
            self._count(True, packed.size)
            whole: bytes = packed.to_pybytes()
            return whole
        key = cache_key(path)
        local = str(self.layout.files / key)
        try:  # a file of its own: one open and one read, no memory map
            with open(local, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            pass
        else:
            self._accesses[key] = time.time()
            self._count(True, len(data))
            return data
        if not self.populate:
            fs, inner = filesystem_for(path, self.io_properties)
            with fs.open_input_stream(inner) as s:
                data = b"".join(iter(lambda: s.read(4 << 20), b""))
            self._count(False, len(data))
            return data
        f, hit = self._open(path)
        with f:
            read: bytes = f.read()
        self._count(hit, len(read))
        return read

    def stats(self) -> dict[str, float]:
        with self._lock:
            out: dict[str, float] = dict(self._stats)
        reads = out["hits"] + out["misses"]
        out["hit_ratio"] = round(out["hits"] / reads, 4) if reads else 0.0
        return out

    def flush(self) -> None:
        """Write access times (for LRU eviction) and populated files to the index."""
        with self._lock:
            accesses, self._accesses = self._accesses, {}
            populated, self._populated = self._populated, []
        if not accesses and not populated:
            return
        with CacheIndex(self.layout) as index:
            index.put_many(populated, replace=False)  # a warmup's row (table, snapshot) wins
            index.touch(accesses)

    def close(self) -> None:
        self.flush()
        with self._lock:
            index, self._index = self._index, None
            self._blocks, self._packed, self._packed_keys, self._generation = {}, {}, {}, -1
        if index is not None:
            index.close()

    def __enter__(self) -> CacheReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
