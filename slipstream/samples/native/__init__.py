"""Slipstream's optional native kernels (`ragged.c`), compiled on first use with the system C compiler.

The batch-phase loader's largest single cost after Parquet decoding is copying each row's history
list in shuffled order. Arrow's `take` does it one list at a time with no look-ahead; `ragged.c`
does the same copy with the next rows' lists prefetched, about twice as fast (see docs/trainer.md).
It also hashes the sample ids for the held-out split (`fnv1a_divisible`, four ids side by side),
about five times as fast as numpy's pass per byte position.

Nothing needs it: without a compiler, when the build fails, or with `SLIPSTREAM_NATIVE=0`,
`kernels()` returns None and callers use their Arrow path (same results); the reason is logged
once. The library is built once per source version into `SLIPSTREAM_NATIVE_DIR` (default
`~/.cache/slipstream/native`); `make venv` builds it ahead (`python -m slipstream.samples.native`), so
ranks that start together find it ready. Concurrent builds are safe: each writes a temporary file
and renames it into place.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slipstream.errors import NativeBuildError

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("ragged.c")
FLAGS = ["-O3", "-std=c99", "-shared", "-fPIC"]
DISABLE_ENV = "SLIPSTREAM_NATIVE"
DIR_ENV = "SLIPSTREAM_NATIVE_DIR"


@dataclass(frozen=True)
class Kernels:
    path: Path
    take_lists_i32: Any
    take_lists_i64: Any
    fnv1a_divisible: Any


_lock = threading.Lock()
_loaded: list[Kernels | None] = []
"""[] before the first `kernels()` call, else [the kernels or None]."""
_override: list[bool] = []


def cache_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slipstream" / "native"


def compiler() -> list[str] | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    return shlex.split(cc) if cc else None


def library_path(directory: Path | None = None) -> Path:
    """Where this source version's library is (or will be) built: one file per (source, flags,
    machine), so a library built ahead (`make venv`, an image's build stage) is found without a
    compiler."""
    parts = [SOURCE.read_bytes(), " ".join(FLAGS).encode(), platform.machine().encode()]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return (cache_dir() if directory is None else directory) / f"ragged-{key}.so"


def build(directory: Path | None = None) -> Path:
    """The shared library's path, compiling it first unless this source version is already built."""
    target = library_path(directory)
    if target.exists():
        return target
    cc = compiler()
    if not cc:
        raise NativeBuildError(f"{target} is not built and no C compiler was found: install one "
                               "(e.g. 'apt-get install gcc') or point CC at it")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".ragged-", suffix=".so")
    except OSError as e:
        raise NativeBuildError(f"cannot write to {target.parent} ({e}): set {DIR_ENV} to a writable folder") from e
    os.close(fd)
    try:
        try:
            proc = subprocess.run([*cc, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NativeBuildError(f"running {' '.join(cc)} failed: {e}") from e
        if proc.returncode != 0:
            raise NativeBuildError(f"{' '.join([*cc, *FLAGS])} {SOURCE} exited {proc.returncode}:\n{proc.stderr.strip()[-2000:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)  # atomic: ranks that build at the same time each rename a whole file
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    log.info("built the native kernels: %s", target)
    return target


def _load(path: Path) -> Kernels:
    lib = ctypes.CDLL(str(path))  # CDLL calls release the GIL: reader threads gather side by side
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    take_lists = {}
    for name in ("take_lists_i32", "take_lists_i64"):
        fn = getattr(lib, name)
        fn.restype = i64
        fn.argtypes = [i64, p, ctypes.c_int32, p, p, p, i64, p, i64, p]
        take_lists[name] = fn
    fnv = lib.fnv1a_divisible
    fnv.restype = None
    fnv.argtypes = [i64, p, p, ctypes.c_uint64, p]
    return Kernels(path, take_lists["take_lists_i32"], take_lists["take_lists_i64"], fnv)


def _disabled_by_env() -> bool:
    return os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off")


def kernels() -> Kernels | None:
    """The loaded kernels, or None (callers then take their Arrow path)."""
    if _override:
        if not _override[-1]:
            return None
    elif _disabled_by_env():
        return None
    if _loaded:
        return _loaded[0]
    with _lock:
        if not _loaded:
            try:
                _loaded.append(_load(build()))
            except (NativeBuildError, OSError) as e:
                log.warning("native kernels unavailable, using Arrow's take and numpy (same results, slower): %s", e)
                _loaded.append(None)
    return _loaded[0]


@contextlib.contextmanager
def enabled(on: bool) -> Iterator[None]:
    """Use (or do not use) the native kernels inside the block, whatever SLIPSTREAM_NATIVE says
    (benchmarks and tests compare both paths in one process)."""
    _override.append(on)
    try:
        yield
    finally:
        _override.pop()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = build()
    except NativeBuildError as e:
        print(f"slipstream: native kernels not built ({e}); the loader will use Arrow's take and numpy", file=sys.stderr)
        return 1
    _load(path)
    print(f"slipstream: native kernels ready at {path}")
    return 0
