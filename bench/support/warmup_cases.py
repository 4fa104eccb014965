"""The measurements of `bench warmup` on one window of files, at one round trip (see
`bench/warmup.py` for what each ratio means). Every ratio compares two timings taken in the same
run, interleaved so that a load change on the shared machine hits both sides."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.support.remote_store import run_threads
from slipstream.cache.settings import WarmKnobs

US, MS, MB = 1e6, 1e3, 1e6
RANGE_THREADS = (8, 16, 32)
"""Ranged GETs in flight tried for the large window's raw side."""


@dataclass(frozen=True)
class Window:
    name: str
    """small | large"""
    uris: list[str]
    size: int
    """Bytes per file."""
    local: list[str]
    """The same files on the local disk, for the `vs_local` baseline."""

    @property
    def bytes(self) -> int:
        return self.size * len(self.uris)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def raw_get(getter: Any, uris: list[str], threads: int) -> int:
    """The best raw transfer at hand: one signed GET per object over a kept-alive connection per
    thread (the client the warmup uses), bytes into the thread's buffer and dropped, no checksum."""
    def get(u: str) -> int:
        return int(getter.get(u[5:], _drop, _no_hash)[0])

    return run_threads(get, uris, threads)


def raw_get_ranges(getter: Any, uris: list[str], size: int, range_bytes: int, threads: int) -> int:
    """Large objects as ranged GETs of `range_bytes` on `threads` threads, bytes dropped."""
    ranges = [(u, off) for u in uris for off in range(0, size, range_bytes)]

    def get(r: tuple[str, int]) -> int:
        return int(getter.get_range(r[0][5:], r[1], min(range_bytes, size - r[1]), _drop)[0])

    return run_threads(get, ranges, threads)


def plain_copy(getter: Any, uris: list[str], threads: int, dest: Path) -> int:
    """What a script would do: GET each object into a local file (no temp name, verification or
    index), with the same client."""
    dest.mkdir(parents=True, exist_ok=True)

    def copy(u: str) -> int:
        fd = os.open(dest / os.path.basename(u), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            return int(getter.get(u[5:], lambda chunk: _write_all(fd, chunk), _no_hash)[0])
        finally:
            os.close(fd)

    return run_threads(copy, uris, threads)


def _drop(chunk: memoryview) -> None:
    pass


def _no_hash(etag: str | None) -> None:
    return None


def _write_all(fd: int, chunk: memoryview) -> None:
    while chunk:
        chunk = chunk[os.write(fd, chunk):]


def read_through(reader: Any, uris: list[str], threads: int) -> int:
    """Read every file whole through `CacheReader.open_input_file`, the call the trainer's loader
    makes: a hit is a slice of a memory-mapped block or a memory-mapped file, a miss reads remote."""
    def read(u: str) -> int:
        with reader.open_input_file(u) as f:
            return len(f.read())

    return run_threads(read, uris, threads)


def read_local(paths: list[str], threads: int) -> int:
    """The same files read from the local disk directly, with the same call on pyarrow's local
    filesystem (what a trainer reading a local warehouse does)."""
    from pyarrow import fs as pafs

    local = pafs.LocalFileSystem()

    def read(p: str) -> int:
        with local.open_input_file(p) as f:
            return len(f.read())

    return run_threads(read, paths, threads)


def sweep_raw(window: Window, getter: Any, thread_counts: list[int], range_bytes: int) -> dict[str, dict[str, Any]]:
    """Raw GET rates at each thread count (small: on 1/5 of the window; large: whole objects at one
    thread per file, and ranged GETs at each count); the fastest is the raw side."""
    out: dict[str, dict[str, Any]] = {}
    if window.name == "small":
        sample = window.uris[::5]
        run_threads(lambda u: int(getter.get(u[5:], _drop, _no_hash)[0]), sample, max(thread_counts))  # untimed
        for n in thread_counts:
            s, nbytes = timed(partial(raw_get, getter, sample, n))
            out[f"get@{n}"] = {"client": "get", "threads": n, "files_per_s": round(len(sample) / s, 1),
                               "mb_per_s": round(nbytes / s / MB, 1)}
        return out
    raw_get(getter, window.uris, len(window.uris))  # untimed
    s, nbytes = timed(lambda: raw_get(getter, window.uris, len(window.uris)))
    out[f"get@{len(window.uris)}"] = {"client": "get", "threads": len(window.uris), "mb_per_s": round(nbytes / s / MB, 1)}
    for n in RANGE_THREADS:
        s, nbytes = timed(partial(raw_get_ranges, getter, window.uris, window.size, range_bytes, n))
        out[f"ranges@{n}"] = {"client": "ranges", "threads": n, "mb_per_s": round(nbytes / s / MB, 1)}
    return out


def best_raw(window: Window, getter: Any, sweep: dict[str, dict[str, Any]], range_bytes: int
             ) -> Callable[[list[str]], int]:
    rate = "files_per_s" if window.name == "small" else "mb_per_s"
    best = max(sweep.values(), key=lambda v: v[rate])
    if best["client"] == "ranges":
        return lambda uris: raw_get_ranges(getter, uris, window.size, range_bytes, best["threads"])
    return lambda uris: raw_get(getter, uris, best["threads"])


def warm_rounds(window: Window, io: dict[str, str], cache_dir: Path, raw: Callable[[list[str]], int],
                copy_threads: int, rounds: int, knobs: WarmKnobs) -> dict[str, Any]:
    """`rounds` rounds of: raw GET, warmup (`knobs`; by default concurrency auto), raw GET of the same
    files (the raw time is the mean of the two), and a plain copy first or last in turn. Small
    windows take 1/rounds of the files per round; a few large files are warmed whole each round
    (evicted in between)."""
    from slipstream.cache.evict import evict_cache
    from slipstream.cache.s3get import getter_for
    from slipstream.cache.warm import CacheItem, WarmReport, warm_files

    getter = getter_for(io)
    whole = len(window.uris) < 4 * rounds
    per_round: list[dict[str, float]] = []
    concurrency: list[int] = []
    for r in range(rounds):
        part = window.uris if whole else window.uris[r::rounds]
        if whole and r:
            evict_cache(cache_dir)
        times: dict[str, float] = {}

        def copy(part: list[str], times: dict[str, float]) -> None:
            times["copy"], _ = timed(partial(plain_copy, getter, part, copy_threads, cache_dir.parent / "plain-copy"))

        def warm(part: list[str], r: int) -> WarmReport:
            return warm_files(cache_dir, [CacheItem(u, window.size) for u in part], io,
                              table_name=f"bench.{window.name}.{r}", knobs=knobs)

        if r % 2:
            copy(part, times)
        raw_a, _ = timed(partial(raw, part))
        times["warm"], report = timed(partial(warm, part, r))
        raw_b, _ = timed(partial(raw, part))
        times["raw"] = (raw_a + raw_b) / 2
        if not r % 2:
            copy(part, times)
        assert report.copied == len(part), report.to_dict()
        concurrency.append(report.concurrency)
        per_round.append({k: round(v, 4) for k, v in times.items()})
    files = len(window.uris) * (rounds if whole else 1)
    raw_s, warm_s, copy_s = (sum(t[k] for t in per_round) for k in ("raw", "warm", "copy"))
    return {
        "rounds": per_round, "warm_concurrency": concurrency,
        "copy_vs_raw": round(median([t["raw"] / t["warm"] for t in per_round]), 3),
        "copy_vs_raw_total": round(raw_s / warm_s, 3),
        "copy_vs_raw_copy": round(median([t["copy"] / t["warm"] for t in per_round]), 3),
        "raw_s_per_file": raw_s / files, "warm_s_per_file": warm_s / files,
        "raw_window_s": raw_s / (rounds if whole else 1), "warm_window_s": warm_s / (rounds if whole else 1),
    }


def reads(window: Window, io: dict[str, str], cache_dir: Path, cold_dir: Path, threads: int, reps: int = 5
          ) -> dict[str, Any]:
    """The window read remote (a reader on an empty cache: every read a miss), then through the
    warm cache and from the local disk, alternately, `reps` times each on one thread (reads are
    CPU-bound; more threads only share the GIL): the best of each."""
    from slipstream.cache.reader import CacheReader

    with CacheReader(str(cold_dir), io) as cold:
        remote_s, _ = timed(lambda: read_through(cold, window.uris, threads))
        assert cold.stats()["misses"] == len(window.uris)
    cached, local = [], []
    with CacheReader(str(cache_dir), io) as reader:
        for _ in range(reps):
            cached.append(timed(lambda: read_through(reader, window.uris, 1))[0])
            local.append(timed(lambda: read_local(window.local, 1))[0])
        stats = reader.stats()
    assert stats["hits"] == reps * len(window.uris) and stats["bytes_local"] == reps * window.bytes, stats
    return {"remote_read_s": remote_s, "cached_read_s": min(cached), "local_read_s": min(local)}


def measure_window(window: Window, io: dict[str, str], workdir: Path, thread_counts: list[int], rounds: int,
                   knobs: WarmKnobs) -> dict[str, Any]:
    """Everything `bench warmup` reports on one window at one round trip."""
    from slipstream.cache.evict import evict_cache
    from slipstream.cache.s3get import getter_for

    getter = getter_for(io)
    range_bytes = knobs.range_bytes
    sweep = sweep_raw(window, getter, thread_counts, range_bytes)
    rate = "files_per_s" if window.name == "small" else "mb_per_s"
    best = max(sweep.values(), key=lambda v: v[rate])
    cache_dir = workdir / f"cache-{window.name}"
    warm = warm_rounds(window, io, cache_dir, best_raw(window, getter, sweep, range_bytes), best["threads"], rounds,
                       knobs)
    read = reads(window, io, cache_dir, workdir / f"cold-{window.name}", best["threads"])
    evict_cache(cache_dir)
    remote_s = min(read["remote_read_s"], warm["raw_window_s"])  # the faster remote read is the baseline
    n, mb = len(window.uris), window.bytes / MB
    out: dict[str, Any] = {
        "files": n, "file_bytes": window.size, "raw": best, "raw_sweep": sweep,
        "warm_concurrency": warm["warm_concurrency"],
        "speedup": round(remote_s / read["cached_read_s"], 2),
        "vs_local": round(read["local_read_s"] / read["cached_read_s"], 3),
        "copy_vs_raw": warm["copy_vs_raw"], "copy_vs_raw_total": warm["copy_vs_raw_total"],
        "copy_vs_raw_copy": warm["copy_vs_raw_copy"],
        "remote_read_s": round(read["remote_read_s"], 3), "raw_read_s": round(warm["raw_window_s"], 3),
        "cached_read_s": round(read["cached_read_s"], 4), "local_read_s": round(read["local_read_s"], 4),
        "rounds": warm["rounds"],
    }
    if window.name == "small":
        out["costs"] = {
            "remote_ms_per_file": round(remote_s / n * MS, 4), "raw_ms_per_file": round(warm["raw_s_per_file"] * MS, 4),
            "warm_ms_per_file": round(warm["warm_s_per_file"] * MS, 4),
            "cached_us_per_file": round(read["cached_read_s"] / n * US, 2),
            "local_us_per_file": round(read["local_read_s"] / n * US, 2),
        }
    else:
        file_mb = window.size / MB
        out["costs"] = {
            "remote_ms_per_mb": round(remote_s / mb * MS, 4),
            "raw_ms_per_mb": round(warm["raw_s_per_file"] / file_mb * MS, 4),
            "warm_ms_per_mb": round(warm["warm_s_per_file"] / file_mb * MS, 4),
            "cached_ms_per_mb": round(read["cached_read_s"] / mb * MS, 4),
            "local_ms_per_mb": round(read["local_read_s"] / mb * MS, 4),
        }
    return out
