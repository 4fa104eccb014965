"""A lean S3 GET for the warmup's small files: one signed GET per object over a kept-alive HTTP
connection per thread, the body streamed straight into a file descriptor.

pyarrow's `open_input_stream` sends a HEAD before every GET (for the size and the ETag); on a
window of thousands of small files that doubles the requests and the store's work. A plain GET
already answers both (`Content-Length`, `ETag`), so this client needs one request per file. It is
used when the store is named by an endpoint (SeaweedFS, MinIO, ... as `s3.endpoint`); otherwise
`copy.py` keeps using pyarrow. Errors are `OSError`s: a missing object is a `FileNotFoundError` and
a refused request (403, 400, ...) a `RequestRefused`, which the warmup does not retry; the others
(connection refused or reset, 5xx, 429) it retries as transient, like pyarrow's.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlparse

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
BUFFER = 256 << 10
"""Receive buffer per thread (an auto-sized warmup may run a few hundred threads)."""

_LOCK = threading.Lock()
_GETTERS: dict[tuple[tuple[str, str], ...], S3Getter | None] = {}


class RequestRefused(OSError):
    """The store refused the request for good (HTTP 4xx other than 404, 408 and 429)."""


class S3Getter:
    """GETs against one S3 endpoint; thread-safe (each thread has its own connection and buffer)."""

    def __init__(self, props: dict[str, str]) -> None:
        url = urlparse(props["s3.endpoint"] if "://" in props["s3.endpoint"] else f"http://{props['s3.endpoint']}")
        self.https = url.scheme == "https"
        self.netloc = url.netloc
        self.host = url.hostname or ""
        self.port = url.port or (443 if self.https else 80)
        self.virtual = props.get("s3.force-virtual-addressing", "").lower() == "true"
        self.access = props.get("s3.access-key-id")
        self.secret = props.get("s3.secret-access-key")
        self.token = props.get("s3.session-token")
        self.region = props.get("s3.region") or "us-east-1"
        self.connect_timeout = float(props.get("s3.connect-timeout", 2.0))
        self.request_timeout = float(props.get("s3.request-timeout", 30.0))
        self._local = threading.local()
        self._keys: tuple[str, bytes] | None = None
        self.connects = 0
        """Connections opened so far (for tests and debugging)."""

    # -- signing (SigV4) -------------------------------------------------------------------
    def _signing_key(self, day: str) -> bytes:
        keys = self._keys
        if keys is None or keys[0] != day:
            k = hmac.new(f"AWS4{self.secret}".encode(), day.encode(), hashlib.sha256).digest()
            for part in (self.region, "s3", "aws4_request"):
                k = hmac.new(k, part.encode(), hashlib.sha256).digest()
            self._keys = keys = (day, k)
        return keys[1]

    def _headers(self, host: str, path: str) -> dict[str, str]:
        headers = {"Host": host}
        if not (self.access and self.secret):
            return headers  # anonymous access
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        day = amz_date[:8]
        headers["x-amz-content-sha256"] = EMPTY_SHA256
        headers["x-amz-date"] = amz_date
        if self.token:
            headers["x-amz-security-token"] = self.token
        names = sorted(k.lower() for k in headers)
        values = {k.lower(): v for k, v in headers.items()}
        canonical = "\n".join([
            "GET", path, "", *(f"{n}:{values[n].strip()}" for n in names), "", ";".join(names), EMPTY_SHA256,
        ])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        sig = hmac.new(self._signing_key(day), to_sign.encode(), hashlib.sha256).hexdigest()
        headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.access}/{scope}, "
                                    f"SignedHeaders={';'.join(names)}, Signature={sig}")
        return headers

    # -- connections -----------------------------------------------------------------------
    def _conn(self, host: str, hostname: str) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection for `host` and whether it was used before (may be stale)."""
        conns: dict[str, http.client.HTTPConnection] = self._local.__dict__.setdefault("conns", {})
        conn = conns.get(host)
        if conn is not None and conn.sock is not None:
            return conn, True
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = cls(hostname, self.port, timeout=self.connect_timeout)
        conn.connect()
        self.connects += 1
        assert conn.sock is not None
        conn.sock.settimeout(self.request_timeout)
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns[host] = conn
        return conn, False

    def _drop(self, host: str) -> None:
        conn = self._local.__dict__.get("conns", {}).pop(host, None)
        if conn is not None:
            conn.close()

    def _buffer(self) -> memoryview:
        buf = self._local.__dict__.get("buf")
        if buf is None:
            buf = self._local.buf = memoryview(bytearray(BUFFER))
        return buf

    # -- GET -------------------------------------------------------------------------------
    def get_to_fd(self, inner: str, fd: int, hasher_for: Callable[[str | None], Any]
                  ) -> tuple[int, str | None, Any]:
        """GET `bucket/key` and write its body to `fd`, feeding the hasher that `hasher_for(ETag)`
        returns (None: no hashing). Returns (bytes written, ETag, hasher). Raises
        FileNotFoundError / OSError."""
        def write(chunk: memoryview) -> None:
            while chunk:
                chunk = chunk[os.write(fd, chunk):]

        return self.get(inner, write, hasher_for)

    def get(self, inner: str, write: Callable[[memoryview], object], hasher_for: Callable[[str | None], Any]
            ) -> tuple[int, str | None, Any]:
        """GET `bucket/key` and hand its body to `write` chunk by chunk (a chunk is only valid
        during the call), feeding the hasher that `hasher_for(ETag)` returns (None: no hashing).
        Returns (bytes, ETag, hasher). Raises FileNotFoundError / OSError."""
        resp, host = self._request(inner, None)
        etag = resp.getheader("ETag")
        md5 = hasher_for(etag)
        size = self._stream(inner, resp, host, write, md5)
        return size, etag, md5

    def get_into(self, inner: str, dest: memoryview, hasher_for: Callable[[str | None], Any]
                 ) -> tuple[int, str | None, Any]:
        """GET `bucket/key` straight into `dest` (no intermediate buffer: the packing path reads
        each small file into its place in the block's buffer). Returns (the object's size, ETag,
        hasher over the bytes read); a size over `len(dest)` is returned without reading the body
        (the caller's size check then fails) and the connection is dropped."""
        resp, host = self._request(inner, None)
        etag = resp.getheader("ETag")
        length = resp.length
        if length is None or length > len(dest):
            self._drop(host)
            return (length if length is not None else len(dest) + 1), etag, None
        try:
            got = 0
            if not length:
                resp.read()  # completes the response, so the connection takes the next request
            while got < length:
                n = resp.readinto(dest[got:length])
                if not n:
                    raise OSError(f"GET s3://{inner}: the body ended after {got} of {length} bytes")
                got += n
            if resp.will_close:
                self._drop(host)
        except (OSError, http.client.HTTPException) as e:
            self._drop(host)
            raise e if isinstance(e, OSError) else OSError(f"GET s3://{inner}: {type(e).__name__}: {e}") from e
        md5 = hasher_for(etag)
        if md5 is not None:
            md5.update(dest[:got])
        return got, etag, md5

    def get_range(self, inner: str, start: int, length: int, write: Callable[[memoryview], object]
                  ) -> tuple[int, int | None, str | None]:
        """GET `length` bytes of `bucket/key` from `start` into `write`. Returns (bytes, the
        object's total size from Content-Range, ETag)."""
        resp, host = self._request(inner, (start, start + length - 1))
        etag = resp.getheader("ETag")
        total = (resp.getheader("Content-Range") or "").rpartition("/")[2]
        size = self._stream(inner, resp, host, write, None)
        return size, int(total) if total.isdigit() else None, etag

    def _request(self, inner: str, byte_range: tuple[int, int] | None) -> tuple[http.client.HTTPResponse, str]:
        bucket, _, key = inner.partition("/")
        if self.virtual:
            host, hostname, path = f"{bucket}.{self.netloc}", f"{bucket}.{self.host}", "/" + quote(key, safe="/~")
        else:
            host, hostname, path = self.netloc, self.host, "/" + quote(inner, safe="/~")
        for attempt in (1, 2):
            try:
                conn, reused = self._conn(host, hostname)
            except OSError as e:
                raise OSError(f"GET s3://{inner}: cannot connect to {host}: {e}") from e
            try:
                headers = self._headers(host, path)
                if byte_range is not None:
                    headers["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                self._drop(host)
                if reused and attempt == 1:
                    continue  # the server closed an idle kept-alive connection: reconnect once
                raise OSError(f"GET s3://{inner}: {type(e).__name__}: {e}") from e
            break
        if resp.status != (200 if byte_range is None else 206):
            body = resp.read(4096)
            self._drop(host)
            msg = f"GET s3://{inner}: HTTP {resp.status} {resp.reason}: {body[:300]!r}"
            if resp.status == 404:
                raise FileNotFoundError(msg)
            if 400 <= resp.status < 500 and resp.status not in (408, 429):
                raise RequestRefused(msg)  # credentials, a bad request: trying again will not help
            raise OSError(msg)
        return resp, host

    def _stream(self, inner: str, resp: http.client.HTTPResponse, host: str, write: Callable[[memoryview], object],
                md5: Any) -> int:
        try:
            buf = self._buffer()
            size = 0
            while n := resp.readinto(buf):
                write(buf[:n])
                if md5 is not None:
                    md5.update(buf[:n])
                size += n
            if resp.will_close:
                self._drop(host)
            return size
        except OSError:
            self._drop(host)
            raise
        except http.client.HTTPException as e:  # IncompleteRead, ...: a cut transfer
            self._drop(host)
            raise OSError(f"GET s3://{inner}: {type(e).__name__}: {e}") from e


def getter_for(io_properties: dict[str, str]) -> S3Getter | None:
    """The shared getter for these S3 properties, or None when no endpoint is set (the AWS
    default: pyarrow resolves regions and addressing there)."""
    key = tuple(sorted((k, v) for k, v in io_properties.items() if k.startswith("s3.")))
    with _LOCK:
        if key not in _GETTERS:
            props = dict(key)
            _GETTERS[key] = S3Getter(props) if props.get("s3.endpoint") else None
        return _GETTERS[key]
