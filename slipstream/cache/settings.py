"""Cache settings, parsed once from `SLIPSTREAM_CACHE_*` variables into a typed object.

The warmup, the cache-aware reader and the Kubernetes pod builder (Airflow team) all read the
cache through this one object. Each variable, the field it sets and what it means:

- `SLIPSTREAM_CACHE_DIR` (`dir`): cache root on this node (default `<SLIPSTREAM_HOME>/cache`)
- `SLIPSTREAM_CACHE_BUDGET_BYTES` (`budget_bytes`): size cap, e.g. `50GiB`, `200000000`; empty/0 =
  no cap
- `SLIPSTREAM_CACHE_CONCURRENCY` (`warm.concurrency`): requests in flight during a warmup: `auto`
  (default: sized from the store's latency and the rate it serves) or a fixed number
- `SLIPSTREAM_CACHE_MAX_CONCURRENCY` (`warm.max_concurrency`): the most requests `auto` puts in
  flight (default 256)
- `SLIPSTREAM_CACHE_PACK_BELOW` (`warm.pack_below_bytes`): files smaller than this are packed into
  cache blocks (default `128KiB`; `0` = never)
- `SLIPSTREAM_CACHE_BLOCK_BYTES` (`warm.block_bytes`): size at which a block of packed files is
  sealed (default `16MiB`)
- `SLIPSTREAM_CACHE_RANGE_BYTES` (`warm.range_bytes`): files larger than this are fetched as
  parallel ranged GETs of this size (default `8MiB`)
- `SLIPSTREAM_CACHE_VERIFY` (`warm.verify`): `size` (default: each copy's size against the table
  metadata) or `etag` (also its MD5 against the store's ETag, when that is an MD5)
- `SLIPSTREAM_CACHE_RETRY_S` (`warm.retry_s`): how long a file's transfer is retried through store
  errors (a restart) before it fails (default 120)
- `SLIPSTREAM_CACHE_LOCK_TIMEOUT_S` (`lock_timeout_s`): how long a warmup waits for another one on
  the same cache
- `SLIPSTREAM_CACHE_NODE_SELECTOR` (`node_selector`): `key=value[,key=value]` labels of the cache
  nodes (default `slipstream.io/cache=true`)
- `SLIPSTREAM_CACHE_VOLUME` (`volume`): `hostPath:/mnt/slipstream-cache` (default) or
  `pvc:CLAIM_NAME`
- `SLIPSTREAM_CACHE_MOUNT_PATH` (`mount_path`): where pods mount the cache volume (default
  `/mnt/slipstream-cache`); inside a pod the cache dir is this path
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from slipstream.env_settings import Parser, settings_from_env
from slipstream.errors import ConfigError
from slipstream.settings import Settings

DEFAULT_NODE_SELECTOR = "slipstream.io/cache=true"
DEFAULT_VOLUME = "hostPath:/mnt/slipstream-cache"
DEFAULT_MOUNT_PATH = "/mnt/slipstream-cache"
VOLUME_KINDS = ("hostPath", "pvc")
VERIFY_MODES = ("etag", "size")

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_bytes(text: str, name: str = "SLIPSTREAM_CACHE_BUDGET_BYTES") -> int | None:
    """`"50GiB"`, `"200MB"`, `"1234"` -> bytes; `""`/`"0"`/`"none"` -> None (no cap)."""
    raw = text.strip()
    if raw.lower() in ("", "0", "none", "unlimited"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)", raw)
    if not m or m.group(2).upper() not in _UNITS:
        raise ConfigError(f"{name} must be a byte count like 50GiB, 200MB or 1234, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def parse_node_selector(text: str) -> dict[str, str]:
    """`"slipstream.io/cache=true,zone=a"` -> {"slipstream.io/cache": "true", "zone": "a"}."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"SLIPSTREAM_CACHE_NODE_SELECTOR must be key=value pairs separated by commas, got {text!r}"
            )
        out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class CacheVolume:
    """The Kubernetes volume that holds the cache on a cache node."""

    kind: str
    """`hostPath` (a node-local folder) or `pvc` (a PersistentVolumeClaim, e.g. local-path)."""
    source: str
    """The host path for `hostPath`, the claim name for `pvc`."""

    @classmethod
    def parse(cls, text: str) -> CacheVolume:
        kind, sep, source = text.partition(":")
        if not sep or kind not in VOLUME_KINDS or not source:
            raise ConfigError(
                f"SLIPSTREAM_CACHE_VOLUME must be hostPath:/abs/path or pvc:CLAIM_NAME, got {text!r}"
            )
        if kind == "hostPath" and not source.startswith("/"):
            raise ConfigError(f"SLIPSTREAM_CACHE_VOLUME hostPath must be absolute, got {source!r}")
        return cls(kind, source)

    def __str__(self) -> str:
        return f"{self.kind}:{self.source}"


@dataclass(frozen=True, kw_only=True)
class WarmKnobs:
    """How a warmup moves bytes (see docs/cache.md, "Knobs", for the measured effect of each)."""

    concurrency: int | None = None
    """Requests in flight; None (`auto`) sizes it from the store's latency and the rate it serves
    (`inflight.py`: Little's law, then doubling while that pays and undoing a step that does not)."""
    max_concurrency: int = 256
    """The most requests `auto` puts in flight (one thread and one connection each)."""
    pack_below_bytes: int = 128 << 10
    """Files smaller than this are packed into cache blocks (when a warmup has many); 0 = never."""
    block_bytes: int = 16 << 20
    """A block of packed files is sealed (renamed into place and committed) at this size."""
    range_bytes: int = 8 << 20
    """Files larger than this are fetched as parallel ranged GETs of this many bytes."""
    verify: str = "size"
    """`etag`: each copy's MD5 is checked against the store's ETag when that is an MD5 (and its size
    against the table metadata); `size`: the size only (no MD5: about 30 µs less CPU per 20 KB)."""
    retry_s: float = 120.0
    """A file whose transfer fails with a store error (connection refused, reset, 5xx) is retried,
    with backoff, for this long after its first failure: longer than a store's restart."""

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"SLIPSTREAM_CACHE_CONCURRENCY must be auto or >= 1, got {self.concurrency}")
        if self.max_concurrency < 1:
            raise ConfigError(f"SLIPSTREAM_CACHE_MAX_CONCURRENCY must be >= 1, got {self.max_concurrency}")
        if self.pack_below_bytes < 0:
            raise ConfigError(f"SLIPSTREAM_CACHE_PACK_BELOW must be >= 0, got {self.pack_below_bytes}")
        if self.block_bytes < 1:
            raise ConfigError(f"SLIPSTREAM_CACHE_BLOCK_BYTES must be positive, got {self.block_bytes}")
        if self.range_bytes < 1 << 16:
            raise ConfigError(f"SLIPSTREAM_CACHE_RANGE_BYTES must be at least 64KiB, got {self.range_bytes}")
        if self.retry_s < 0:
            raise ConfigError(f"SLIPSTREAM_CACHE_RETRY_S must be >= 0 seconds, got {self.retry_s}")
        if self.verify not in VERIFY_MODES:
            raise ConfigError(f"SLIPSTREAM_CACHE_VERIFY must be one of {', '.join(VERIFY_MODES)}, got {self.verify!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WarmKnobs:
        return settings_from_env(cls, env, prefix="SLIPSTREAM_CACHE_", parsers=_WARM_PARSERS,
                                 names={"pack_below_bytes": "SLIPSTREAM_CACHE_PACK_BELOW"})

    def as_env(self) -> dict[str, str]:
        return {
            "SLIPSTREAM_CACHE_CONCURRENCY": "auto" if self.concurrency is None else str(self.concurrency),
            "SLIPSTREAM_CACHE_MAX_CONCURRENCY": str(self.max_concurrency),
            "SLIPSTREAM_CACHE_PACK_BELOW": str(self.pack_below_bytes),
            "SLIPSTREAM_CACHE_BLOCK_BYTES": str(self.block_bytes),
            "SLIPSTREAM_CACHE_RANGE_BYTES": str(self.range_bytes),
            "SLIPSTREAM_CACHE_RETRY_S": str(self.retry_s),
            "SLIPSTREAM_CACHE_VERIFY": self.verify,
        }


@dataclass(frozen=True, kw_only=True)
class CacheSettings:
    dir: str
    """Cache root on this node: `files/` (copies), `tmp/` (in-flight copies), `index.sqlite`."""
    budget_bytes: int | None = None
    """Upper bound of the cache's size; None = no cap (evicts only files that left the window)."""
    warm: WarmKnobs = field(default_factory=WarmKnobs)
    """How a warmup copies: concurrency, packing, block and range sizes, retries."""
    lock_timeout_s: float = 600.0
    """A warmup waits this long for another warmup of the same cache before failing."""
    node_selector: dict[str, str] = field(default_factory=lambda: parse_node_selector(DEFAULT_NODE_SELECTOR))
    """Labels of the nodes that hold a cache; the warmup pod and the training pod both select them."""
    volume: CacheVolume = field(default_factory=lambda: CacheVolume.parse(DEFAULT_VOLUME))
    """The volume holding the cache on those nodes."""
    mount_path: str = DEFAULT_MOUNT_PATH
    """Mount point of `volume` in pods; pods run with SLIPSTREAM_CACHE_DIR set to it."""

    def __post_init__(self) -> None:
        if self.budget_bytes is not None and self.budget_bytes < 1:
            raise ConfigError(f"SLIPSTREAM_CACHE_BUDGET_BYTES must be positive, got {self.budget_bytes}")
        if self.lock_timeout_s < 0:
            raise ConfigError(f"SLIPSTREAM_CACHE_LOCK_TIMEOUT_S must be >= 0, got {self.lock_timeout_s}")
        if not self.mount_path.startswith("/"):
            raise ConfigError(f"SLIPSTREAM_CACHE_MOUNT_PATH must be absolute, got {self.mount_path!r}")

    @classmethod
    def from_env(cls, settings: Settings, env: Mapping[str, str] | None = None) -> CacheSettings:
        env = os.environ if env is None else env
        return settings_from_env(cls, env, prefix="SLIPSTREAM_CACHE_", parsers=_PARSERS,
                                 given={"dir": settings.cache_dir, "warm": WarmKnobs.from_env(env)})

    def as_env(self) -> dict[str, str]:
        """The settings as variables for a pod or subprocess (the dir becomes the mount path there)."""
        return {
            "SLIPSTREAM_CACHE_BUDGET_BYTES": str(self.budget_bytes or ""),
            **self.warm.as_env(),
            "SLIPSTREAM_CACHE_LOCK_TIMEOUT_S": str(self.lock_timeout_s),
            "SLIPSTREAM_CACHE_NODE_SELECTOR": ",".join(f"{k}={v}" for k, v in self.node_selector.items()),
            "SLIPSTREAM_CACHE_VOLUME": str(self.volume),
            "SLIPSTREAM_CACHE_MOUNT_PATH": self.mount_path,
        }


def _parse_concurrency(text: str) -> int | None:
    raw = text.strip().lower()
    if raw == "auto":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"SLIPSTREAM_CACHE_CONCURRENCY must be auto or a number of requests in flight, "
                          f"got {text!r}") from None


def _size(name: str) -> Callable[[str], int]:
    return lambda text: parse_bytes(text, f"SLIPSTREAM_CACHE_{name}") or 0


_WARM_PARSERS: dict[str, Parser] = {
    "concurrency": _parse_concurrency,
    "pack_below_bytes": _size("PACK_BELOW"),
    "block_bytes": _size("BLOCK_BYTES"),
    "range_bytes": _size("RANGE_BYTES"),
    "verify": lambda text: text.strip().lower(),
}
_PARSERS: dict[str, Parser] = {
    "budget_bytes": parse_bytes,
    "node_selector": parse_node_selector,
    "volume": CacheVolume.parse,
}
"""The variables with a syntax of their own; `settings_from_env` converts the others by type."""
