"""Copy one remote file into the cache so that it appears whole or not at all.

The bytes land in `<cache>/tmp/<random>.part`; the size (and the S3 ETag when it is checkable)
is verified; only then is the file renamed into `files/` with `os.replace`, which is atomic on
one filesystem. A reader therefore sees either no file (a miss: it reads remote) or the complete
one. A copy killed mid-way leaves only a `.part` file, which the next warmup deletes.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from pyarrow import fs as pafs

from slipstream.cache.remote import etag_matches, filesystem_for
from slipstream.errors import CacheError

CHUNK = 4 << 20
WHOLE_READ_MAX = 8 << 20


@dataclass(frozen=True)
class Placed:
    remote: str
    local: Path
    size: int
    etag: str | None


def copy_atomic(remote: str, local: Path, tmp_dir: Path, io_properties: dict[str, str],
                expected_size: int | None = None, *, tmp_prefix: str = "w-") -> Placed:
    """Copy `remote` to `local` through a temporary file; raises CacheError on a mismatch.
    `tmp_prefix` tells warmup copies (`w-`, cleared by the next warmup) from reader copies (`r-`)."""
    fs, inner = filesystem_for(remote, io_properties)
    tmp = tmp_dir / f"{tmp_prefix}{uuid.uuid4().hex}.part"
    md5 = hashlib.md5()
    size = 0
    etag: str | None = None
    try:
        with fs.open_input_stream(inner) as src, open(tmp, "wb") as dst:
            if isinstance(fs, pafs.S3FileSystem):
                meta = src.metadata()
                raw = meta.get(b"ETag") or meta.get("ETag")
                etag = raw.decode() if isinstance(raw, bytes) else raw
            if expected_size is not None and expected_size < WHOLE_READ_MAX:
                # small file: one exactly-sized read (+1 byte to notice a longer file)
                chunks = iter(lambda: src.read(expected_size + 1), b"")
            else:
                chunks = iter(lambda: src.read(CHUNK), b"")
            for chunk in chunks:
                dst.write(chunk)
                if etag:
                    md5.update(chunk)
                size += len(chunk)
        if expected_size is not None and size != expected_size:
            raise CacheError(
                f"copy of {remote} has {size} bytes but the table metadata says {expected_size}: "
                "the file changed or the transfer was cut; re-run the warmup"
            )
        if etag and etag_matches(etag, md5) is False:
            raise CacheError(f"copy of {remote} does not match its ETag {etag}: re-run the warmup")
        local.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, local)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Placed(remote, local, size, etag)


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
