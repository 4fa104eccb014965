"""Copy one remote file into the cache so that it appears whole or not at all.

The bytes land in `<cache>/tmp/<random>.part`; the size (and the S3 ETag when it is checkable)
is verified; only then is the file renamed into `files/` with `os.replace`, which is atomic on
one filesystem. A reader therefore sees either no file (a miss: it reads remote) or the complete
one. A copy killed mid-way leaves only a `.part` file, which the next warmup deletes.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from pyarrow import fs as pafs

from slipstream.cache.remote import etag_checkable, etag_matches, filesystem_for
from slipstream.cache.s3get import S3Getter, getter_for
from slipstream.errors import CacheError

CHUNK = 4 << 20
WHOLE_READ_MAX = 8 << 20
RANGE = 8 << 20
"""Default range size: larger objects are fetched as parallel ranged GETs of this many bytes
(`SLIPSTREAM_CACHE_RANGE_BYTES`)."""
Write = Callable[[memoryview], object]
"""Takes one chunk of a file's bytes (valid only during the call)."""


@dataclass(slots=True)
class Placed:
    remote: str
    local: Path
    """The cached file, or the block file that holds it."""
    size: int
    etag: str | None
    block: str | None = None
    """Name of the block (under `blocks/`) the file was packed into; None for a file of its own."""
    offset: int | None = None
    """Where the file starts in its block."""



def writer_at(fd: int, offset: int) -> Callable[[memoryview], None]:
    """A sink writing consecutive chunks into `fd` from `offset` on (each range of a ranged GET
    writes its own part of the file, so parallel ranges need no lock)."""
    pos = offset

    def write(chunk: memoryview) -> None:
        nonlocal pos
        while chunk:
            n = os.pwrite(fd, chunk, pos)
            pos += n
            chunk = chunk[n:]

    return write

def copy_atomic(remote: str, local: Path, tmp_dir: Path, io_properties: dict[str, str],
                expected_size: int | None = None, *, tmp_prefix: str = "w-", range_bytes: int = RANGE,
                verify_etag: bool = True) -> Placed:
    """Copy `remote` to `local` through a temporary file; raises CacheError on a mismatch.
    `tmp_prefix` tells warmup copies (`w-`, cleared by the next warmup) from reader copies (`r-`).
    An S3 object over `range_bytes` is fetched as parallel ranged GETs. `verify_etag`: False checks
    the size only (no MD5)."""
    fs, inner = filesystem_for(remote, io_properties)
    tmp = tmp_dir / f"{tmp_prefix}{uuid.uuid4().hex}.part"
    try:
        if expected_size is not None and expected_size > range_bytes and isinstance(fs, pafs.S3FileSystem):
            if (getter := getter_for(io_properties)) is not None:
                size, etag, checked = _copy_ranged_get(getter, inner, tmp, expected_size, range_bytes, verify_etag)
            else:
                size, etag, checked = _copy_ranged(fs, inner, tmp, expected_size, range_bytes, verify_etag)
        else:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                size, etag, checked = fetcher(io_properties, verify_etag)(remote, partial(write_all, fd), expected_size)
            finally:
                os.close(fd)
        verify_copy(remote, size, expected_size, etag, checked)
        try:
            os.replace(tmp, local)
        except FileNotFoundError:  # the first file of its folder (not a stat + mkdir per file)
            local.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, local)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Placed(remote, local, size, etag)


Fetch = Callable[[str, Write, "int | None"], "tuple[int, str | None, bool | None]"]


def fetcher(io_properties: dict[str, str], verify_etag: bool = True) -> Fetch:
    """A function that hands the whole of a remote file to `write`, chunk by chunk, and returns
    (bytes, the store's ETag, whether the bytes match it: None when it cannot be checked or
    `verify_etag` is off); the client is looked up once (a thread fetches many files)."""
    getter = getter_for(io_properties)
    hasher_for = md5_for if verify_etag else no_hash

    def fetch(remote: str, write: Write, expected_size: int | None) -> tuple[int, str | None, bool | None]:
        if getter is not None and remote.startswith("s3://"):
            return _copy_get(getter, remote[5:], write, hasher_for)
        fs, inner = filesystem_for(remote, io_properties)
        if isinstance(fs, pafs.S3FileSystem) and getter is not None:
            return _copy_get(getter, inner, write, hasher_for)
        return _copy_stream(fs, inner, write, expected_size, verify_etag)

    return fetch


def write_all(fd: int, chunk: memoryview | bytes) -> None:
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view):]


def verify_copy(remote: str, size: int, expected_size: int | None, etag: str | None, checked: bool | None) -> None:
    if expected_size is not None and size != expected_size:
        raise CacheError(
            f"copy of {remote} has {size} bytes but the table metadata says {expected_size}: "
            "the file changed or the transfer was cut; re-run the warmup"
        )
    if checked is False:
        raise CacheError(f"copy of {remote} does not match its ETag {etag}: re-run the warmup")


def md5_for(etag: str | None) -> Any:
    """A hasher for a body whose ETag is checkable (an MD5), else None: no hashing."""
    return hashlib.md5() if etag and etag_checkable(etag) else None


def no_hash(etag: str | None) -> None:
    """`md5_for` when only the size is checked (`SLIPSTREAM_CACHE_VERIFY=size`)."""
    return None


def _copy_get(getter: S3Getter, inner: str, write: Write, hasher_for: Callable[[str | None], Any] = md5_for
              ) -> tuple[int, str | None, bool | None]:
    """One plain GET (no HEAD: its response carries the ETag) streamed into `write`; the MD5 is
    computed when the ETag can be checked, which the response says before the body."""
    size, etag, md5 = getter.get(inner, write, hasher_for)
    checked = etag_matches(etag, md5) if etag and md5 is not None else None
    return size, etag, checked


def _copy_stream(fs: pafs.FileSystem, inner: str, write: Write, expected_size: int | None, verify_etag: bool = True
                 ) -> tuple[int, str | None, bool | None]:
    """One GET, written as it arrives; the MD5 is computed only when the ETag can be checked."""
    size = 0
    etag: str | None = None
    md5 = None
    with fs.open_input_stream(inner) as src:
        if isinstance(fs, pafs.S3FileSystem):
            etag = _etag(src.metadata())
            if verify_etag and etag and etag_checkable(etag):
                md5 = hashlib.md5()
        if expected_size is not None and expected_size < WHOLE_READ_MAX:
            # small file: one exactly-sized read (+1 byte to notice a longer file)
            chunks = iter(lambda: src.read(expected_size + 1), b"")
        else:
            chunks = iter(lambda: src.read(CHUNK), b"")
        for chunk in chunks:
            write(memoryview(chunk))
            if md5 is not None:
                md5.update(chunk)
            size += len(chunk)
    return size, etag, (etag_matches(etag, md5) if etag and md5 is not None else None)


def _copy_ranged(fs: pafs.FileSystem, inner: str, tmp: Path, expected_size: int, range_bytes: int,
                 verify_etag: bool = True) -> tuple[int, str | None, bool | None]:
    """A large object as parallel ranged GETs written in place (one slow stream per file would cap
    a warmup of a few large files at single-connection speed). Such objects are multipart uploads
    whose ETag cannot be checked without the part sizes, so the size is the check."""
    with fs.open_input_file(inner) as src:
        etag = _etag(src.metadata())
        size = src.size()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            def fetch(offset: int) -> int:
                data = src.read_at(min(range_bytes, size - offset), offset)
                return os.pwrite(fd, data, offset)

            written = sum(_range_pool().map(fetch, range(0, size, range_bytes)))
        finally:
            os.close(fd)
    if written != size:
        raise CacheError(f"ranged copy of {inner} wrote {written} of {size} bytes; re-run the warmup")
    return size, etag, check_file(tmp, etag) if verify_etag else None


def _copy_ranged_get(getter: S3Getter, inner: str, tmp: Path, expected_size: int, range_bytes: int,
                     verify_etag: bool = True) -> tuple[int, str | None, bool | None]:
    """`_copy_ranged` with the one-GET client: no HEAD first (the size is the table metadata's;
    each range's Content-Range confirms the object's), each range written from the receive buffer
    straight to its place in the file. Ranges from different versions of the object (their ETags
    differ) are refused."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        def fetch(offset: int) -> tuple[int, int | None, str | None]:
            return getter.get_range(inner, offset, min(range_bytes, expected_size - offset), writer_at(fd, offset))

        parts = list(_range_pool().map(fetch, range(0, expected_size, range_bytes)))
    finally:
        os.close(fd)
    size, etag = check_ranges(f"s3://{inner}", parts, expected_size)
    return size, etag, check_file(tmp, etag) if verify_etag else None


def check_ranges(remote: str, parts: list[tuple[int, int | None, str | None]], expected_size: int
                 ) -> tuple[int, str | None]:
    """The object's (size, ETag) from its ranges' (bytes, Content-Range total, ETag). Ranges of
    different versions of the object (their ETags differ) or fewer bytes than the ranges
    announced are refused; a size the store contradicts is returned for `verify_copy` to name."""
    etags = {etag for _, _, etag in parts}
    if len(etags) > 1:
        raise CacheError(f"{remote} changed during its copy (ETags {sorted(map(str, etags))}); re-run the warmup")
    totals = {total for _, total, _ in parts if total is not None}
    written = sum(n for n, _, _ in parts)
    size = max(totals) if totals else written  # a longer or shorter object fails the size check
    if totals == {expected_size} and written != expected_size:
        raise CacheError(f"ranged copy of {remote} wrote {written} of {expected_size} bytes; re-run the warmup")
    return size, (etags.pop() if etags else None)


def check_file(path: Path, etag: str | None) -> bool | None:
    """Large objects are multipart uploads whose ETag cannot be checked without the part sizes;
    a single-part ETag is checked by reading the file back."""
    if not (etag and etag_checkable(etag)):
        return None
    md5 = hashlib.md5()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            md5.update(chunk)
    return etag_matches(etag, md5)


def _etag(meta: Any) -> str | None:
    raw = meta.get(b"ETag") or meta.get("ETag")
    return raw.decode() if isinstance(raw, bytes) else raw


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _range_pool() -> ThreadPoolExecutor:
    """Shared by all copies of the process: range reads never wait on anything, so no deadlock."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="warm-range")
        return _POOL


def clear_tmp(tmp_dir: Path, reader_max_age_s: float = 3600.0) -> int:
    """Delete leftovers of interrupted copies; call under the cache lock, so every warmup `.part`
    is a dead one. A reader's `.part` may be in flight: only old ones go. Returns how many."""
    n = 0
    now = time.time()
    if tmp_dir.exists():
        for p in tmp_dir.glob("*.part"):
            try:
                if p.name.startswith("w-") or now - p.stat().st_mtime > reader_max_age_s:
                    p.unlink()
                    n += 1
            except FileNotFoundError:
                pass
    return n
