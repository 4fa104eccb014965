"""Where a warehouse file lives and how to reach it: pyarrow filesystems from pyiceberg-style
FileIO properties (`s3.endpoint`, `s3.access-key-id`, ...), and the cache key of a remote path.

Both the warmup and the reader go through here so a hit and a miss name the same file.
"""

from __future__ import annotations

import hashlib
import threading
from urllib.parse import urlparse

from pyarrow import fs as pafs

from slipstream.errors import CacheError

_FS_LOCK = threading.Lock()
_FS_CACHE: dict[tuple[tuple[str, str], ...], pafs.FileSystem] = {}


def split_uri(path: str) -> tuple[str, str]:
    """`s3://bucket/key` -> ("s3", "bucket/key"); `file:///a/b` or `/a/b` -> ("file", "/a/b")."""
    if path.startswith("s3://"):  # the common case, without urlparse (it showed per file on large windows)
        rest = path[5:]
        if rest.partition("/")[0]:
            return "s3", rest
    parsed = urlparse(path)
    scheme = parsed.scheme.lower()
    if scheme in ("s3", "s3a", "s3n"):
        if not parsed.netloc:
            raise CacheError(f"S3 path {path!r} names no bucket: expected s3://bucket/key")
        return "s3", f"{parsed.netloc}{parsed.path}"
    if scheme in ("", "file"):
        local = parsed.path if scheme == "file" else path
        if not local.startswith("/"):
            raise CacheError(f"local warehouse path {path!r} must be absolute")
        return "file", local
    raise CacheError(f"unsupported warehouse scheme {scheme!r} in {path!r}: use s3:// or a local path")


def cache_key(path: str) -> str:
    """Relative path under the cache's `files/` that mirrors the remote path (stable, readable)."""
    scheme, rest = split_uri(path)
    if "//" not in rest and "/." not in rest and not rest.startswith(".") and not rest.endswith("/"):
        return f"{scheme}/{rest.lstrip('/')}"  # already clean: the common case, a few µs less per file
    parts = [p for p in rest.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise CacheError(f"path {path!r} contains '.' or '..' segments; refusing to map it into the cache")
    return "/".join([scheme, *parts])


def _s3_filesystem(props: dict[str, str]) -> pafs.FileSystem:
    endpoint = props.get("s3.endpoint", "")
    kwargs: dict[str, object] = {
        "access_key": props.get("s3.access-key-id"),
        "secret_key": props.get("s3.secret-access-key"),
        "session_token": props.get("s3.session-token"),
        "region": props.get("s3.region") or "us-east-1",
        # fail fast when the server is down: our own retries (warm.py) decide how long to wait
        "connect_timeout": float(props.get("s3.connect-timeout", 2.0)),
        "request_timeout": float(props.get("s3.request-timeout", 30.0)),
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=2),
    }
    if endpoint:
        url = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
        kwargs["endpoint_override"] = url.netloc
        kwargs["scheme"] = url.scheme or "http"
    if props.get("s3.force-virtual-addressing", "").lower() == "true":
        kwargs["force_virtual_addressing"] = True
    return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None})


def filesystem_for(path: str, io_properties: dict[str, str]) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem that serves `path`, and the path inside it. Instances are shared
    (pyarrow filesystems are thread-safe) so connection pools are reused across files."""
    scheme, inner = split_uri(path)
    if scheme == "file":
        return pafs.LocalFileSystem(), inner
    key = tuple(sorted((k, v) for k, v in io_properties.items() if k.startswith("s3.")))
    with _FS_LOCK:
        fs = _FS_CACHE.get(key)
        if fs is None:
            fs = _FS_CACHE[key] = _s3_filesystem(dict(key))
    return fs, inner


def etag_checkable(etag: str) -> bool:
    """Whether `etag_matches` can decide for this ETag (worth computing an MD5 for)."""
    body, _, parts = etag.strip().strip('"').partition("-")
    return len(body) == 32 and parts in ("", "1")


def etag_matches(etag: str, md5: hashlib._Hash) -> bool | None:
    """Check an S3 ETag against the MD5 of the bytes read. True/False when the ETag is checkable
    (a plain MD5, or a one-part multipart ETag = MD5 of the MD5); None when it is not (multipart
    with several parts of unknown size, SSE-KMS, ...)."""
    tag = etag.strip().strip('"').lower()
    if not tag:
        return None
    body, _, parts = tag.partition("-")
    if not parts:
        return body == md5.hexdigest() if len(body) == 32 else None
    if parts == "1":
        return body == hashlib.md5(md5.digest()).hexdigest()
    return None
