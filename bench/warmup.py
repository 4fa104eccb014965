"""`slipstream bench warmup --json`: does warming the cache pay off, and how close does the warmup
come to the store's best raw transfer rate? Everything runs against a real SeaweedFS S3 server on
127.0.0.1 started for the run, and every ratio compares two measurements taken in this same run.

- small window: `--files` files of `--file-kb` KB (default 10,000 x 20 KB, the Weibo case): time to
  read all of them through `CacheReader` remote (cold cache) vs from the warm cache (small files
  are packed into blocks) -> `small_speedup`
- large window: `--large-files` files of `--large-mb` MB -> `large_speedup`
- raw parallel GET (bytes into memory, nothing written, no checksum) with two clients: pyarrow
  (HEAD + GET) and the one-GET client the warmup uses, at each `--threads` count after one untimed
  pass; the fastest (client, threads) is the raw side. The warmup picks its concurrency from the
  same candidates (on a tenth of the window, into a scratch cache). Then `--rounds` rounds over
  1/rounds of the window each: raw GET, warmup, raw GET of the same files (the raw time is the
  mean of the two, which cancels a load change during the round on this shared machine);
  `copy_vs_raw` = the median over rounds of raw time / warmup time on the small window
  (`copy_vs_raw_total`: of the sums; `copy_vs_raw_large` on the large one, whose rounds each copy
  the whole window). `copy_vs_raw_copy` compares with a plain parallel copy (GET + write a local
  file, no temp name, verification or index) timed in the same rounds.
- reads go through `CacheReader.open_input_file`, the call the trainer's loader makes; the remote
  baseline of a speedup is the faster of the cold reader and the best raw GET; the cached read is
  the best of 3 runs at 1 thread and at the remote's best thread count (each side at its best
  configuration)
- incremental: an Iceberg `samples` table on the S3 warehouse, a 2-day window warmed, one new day
  appended, the re-run's copied bytes vs the new day's data bytes -> `incremental_only_new_files`
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slipstream bench warmup")
    p.add_argument("--files", type=int, default=10_000, help="small files in the small window")
    p.add_argument("--file-kb", type=int, default=20)
    p.add_argument("--large-files", type=int, default=6)
    p.add_argument("--large-mb", type=int, default=16)
    p.add_argument("--threads", default="8,32,64", help="thread counts tried for the raw parallel GET and the warmup")
    p.add_argument("--rounds", type=int, default=5, help="interleaved raw GET / warmup rounds (copy_vs_raw is their median)")
    p.add_argument("--workdir", help="where the S3 data and the cache go (default: a temp folder, removed)")
    p.add_argument("--json", action="store_true", help="accepted for `slipstream bench warmup --json` (output is JSON anyway)")
    return p.parse_args(argv)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _read_all(reader: Any, uris: list[str], threads: int) -> int:
    """Read every file whole through `CacheReader.open_input_file`, the call the trainer's loader
    makes (`trainers.data.units.file_opener`): a hit is a slice of a block or a memory-mapped file."""
    def read(u: str) -> int:
        with reader.open_input_file(u) as f:
            return len(f.read())

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(read, uris))


def _raw_get_pyarrow(fs: Any, uris: list[str], threads: int, size: int) -> int:
    """GET each object into memory through pyarrow (a HEAD, then the GET), read the way the copy
    reads it (sized reads; an unsized `read()` of a stream is several times slower on large objects)."""
    step = min(size + 1, 4 << 20)

    def get(u: str) -> int:
        n = 0
        with fs.open_input_stream(u.removeprefix("s3://")) as f:
            while chunk := f.read(step):
                n += len(chunk)
        return n

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(get, uris))


def _raw_get_one(getter: Any, uris: list[str], threads: int, size: int) -> int:
    """GET each object with one signed request over a kept-alive connection per thread (the
    leanest client at hand, the one the warmup uses) into memory, bytes dropped, no checksum."""
    def get(u: str) -> int:
        return int(getter.get(u.removeprefix("s3://"), lambda chunk: None, lambda etag: None)[0])

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(get, uris))


def _raw_copy(fs: Any, uris: list[str], threads: int, size: int, dest: Path) -> int:
    """The plain parallel copy a script would do: GET and write to a local file (no temp name, no
    verification, no index)."""
    import os

    dest.mkdir(parents=True, exist_ok=True)
    step = min(size + 1, 4 << 20)

    def copy(u: str) -> int:
        n = 0
        with fs.open_input_stream(u.removeprefix("s3://")) as f, open(dest / os.path.basename(u), "wb") as out:
            while chunk := f.read(step):
                n += out.write(chunk)
        return n

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(copy, uris))


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _window_case(name: str, uris: list[str], size: int, io: dict[str, str], cache_dir: Path,
                 thread_counts: list[int], rounds: int) -> dict[str, Any]:
    from slipstream.cache.evict import evict_cache
    from slipstream.cache.reader import CacheReader
    from slipstream.cache.remote import filesystem_for
    from slipstream.cache.s3get import getter_for
    from slipstream.cache.warm import CacheItem, warm_files

    fs, _ = filesystem_for(uris[0], io)
    getter = getter_for(io)
    clients: dict[str, Callable[[list[str], int], int]] = {
        "pyarrow": lambda us, n: _raw_get_pyarrow(fs, us, n, size),
        "one_get": lambda us, n: _raw_get_one(getter, us, n, size),
    }
    clients["one_get"](uris, max(thread_counts))  # untimed pass: the server's first reads are slower for everyone
    # both sides choose their concurrency from the same candidates: raw GET (either client) on the
    # whole window, the warmup on a tenth of it (into a scratch cache)
    raw: dict[str, dict[int, dict[str, float]]] = {c: {} for c in clients}
    for n in thread_counts:
        for c, get in clients.items():
            s, nbytes = _timed(lambda: get(uris, n))
            raw[c][n] = {"seconds": round(s, 3), "files_per_s": round(len(uris) / s, 1),
                         "mb_per_s": round(nbytes / s / 1e6, 1)}
    client, best = max(((c, n) for c in raw for n in raw[c]), key=lambda cn: raw[cn[0]][cn[1]]["files_per_s"])
    sample = [CacheItem(u, size) for u in (uris[::10] if len(uris) >= 100 else uris)]
    warm_by_threads = {}
    for n in thread_counts:
        scratch = cache_dir.parent / f"scratch-{name}-{n}"
        s, _ = _timed(lambda: warm_files(scratch, sample, io, table_name=f"bench.{name}.sweep", concurrency=n))
        warm_by_threads[n] = {"seconds": round(s, 3), "files_per_s": round(len(sample) / s, 1)}
        shutil.rmtree(scratch, ignore_errors=True)
    warm_best = max(warm_by_threads, key=lambda n: warm_by_threads[n]["files_per_s"])
    reps = 1 if len(uris) > 100 else 3  # a small window is read 3 times to tame the machine's noise
    remote_s = min(_timed(lambda: _read_all(CacheReader(str(cache_dir), io), uris, best))[0] for _ in range(reps))
    # warmup vs raw GET in rounds, both at their best settings, over 1/rounds of the window each
    # (or, for a window of a few files, over all of it, evicted again after each round). In a round
    # the warmup is bracketed by two raw GETs of the same files (their mean is the round's raw
    # time, which cancels a load change during the round on this shared machine); the plain copy
    # runs first or last, alternately.
    whole = len(uris) < 4 * rounds
    per_round: list[dict[str, float]] = []
    copied = copied_bytes = packed = 0
    for r in range(rounds):
        part = uris if whole else uris[r::rounds]
        if whole and r:
            evict_cache(cache_dir)
        times: dict[str, float] = {}
        plain_copy = lambda: _raw_copy(fs, part, best, size, cache_dir.parent / f"rawcopy-{name}")  # noqa: E731
        if r % 2:
            times["raw_copy"], _ = _timed(plain_copy)
        raw_a, _ = _timed(lambda: clients[client](part, best))
        times["warm"], out = _timed(lambda: warm_files(cache_dir, [CacheItem(u, size) for u in part], io,
                                                       table_name=f"bench.{name}.{r}", concurrency=warm_best))
        raw_b, _ = _timed(lambda: clients[client](part, best))
        times["raw"] = (raw_a + raw_b) / 2
        if not r % 2:
            times["raw_copy"], _ = _timed(plain_copy)
        copied += out.copied
        copied_bytes += out.bytes
        packed += getattr(out, "packed", 0)  # (0 where the library does not pack)
        per_round.append({k: round(v, 3) for k, v in times.items()})
    raw_s, warm_s, raw_copy_s = (sum(t[k] for t in per_round) for k in ("raw", "warm", "raw_copy"))
    # cached reads: the best of 3, each at 1 thread and at the remote's best count (local reads are
    # CPU-bound and need no parallelism; many threads only fight over 2 cores)
    reader = CacheReader(str(cache_dir), io)
    cached_s = min(_timed(lambda: _read_all(reader, uris, n))[0] for n in (1, best) for _ in range(3))
    stats = reader.stats()
    reader.close()
    assert stats["hits"] == 6 * len(uris) and stats["bytes_local"] == 6 * len(uris) * size, stats
    evict_cache(cache_dir)  # the next case starts from an empty cache
    warm_fps = copied / warm_s
    # the remote baseline is the faster of the cold reader and the best raw GET (conservative)
    remote_best = min(remote_s, raw[client][best]["seconds"])
    return {
        "files": len(uris), "file_bytes": size, "raw_client": client, "threads": best,
        "raw_get_by_threads": raw, "warm_threads": warm_best, "warm_sample_by_threads": warm_by_threads,
        "remote_read_s": round(remote_s, 3), "cached_read_s": round(cached_s, 3),
        "speedup": round(remote_best / cached_s, 2),
        "warm_s": round(warm_s, 3), "warm_files_per_s": round(warm_fps, 1), "packed": packed,
        "warm_mb_per_s": round(copied_bytes / warm_s / 1e6, 1),
        "raw_get_interleaved_files_per_s": round(len(uris) / raw_s, 1),
        "raw_copy_interleaved_files_per_s": round(len(uris) / raw_copy_s, 1),
        "rounds": per_round,
        "copy_vs_raw": round(_median([t["raw"] / t["warm"] for t in per_round]), 3),
        "copy_vs_raw_total": round(raw_s / warm_s, 3),
        "copy_vs_raw_copy": round(_median([t["raw_copy"] / t["warm"] for t in per_round]), 3),
    }


def _incremental_case(workdir: Path, endpoint: Any) -> dict[str, Any]:
    import os
    from datetime import date, datetime, timedelta, timezone

    from slipstream.cache.warm import warm_window
    from slipstream.dev.datagen import GeneratorConfig, reference_samples
    from slipstream.lake.iceberg import get_catalog, samples_table
    from slipstream.settings import Settings

    days = list(reference_samples(GeneratorConfig(start_day=date(2026, 3, 1), days=4, impressions_per_day=2000)).values())
    saved = {k: os.environ.get(k) for k in endpoint.env()}
    os.environ.update(endpoint.env())  # how credentials reach the catalog: SLIPSTREAM_S3_* variables
    try:
        settings = Settings(home=workdir / "home", warehouse=endpoint.warehouse("bench-wh"),
                            cache_dir=str(workdir / "icache"))
        tbl = samples_table(get_catalog(settings), settings.namespace)
        for d in days[:3]:
            tbl.append(d)
        end3 = datetime(2026, 3, 4, tzinfo=timezone.utc)
        before = {t.file.file_path for t in tbl.scan().plan_files()}
        first = warm_window(settings, "samples", 2, end3, tbl.current_snapshot().snapshot_id, None, None)
        tbl.append(days[3])
        new = {t.file.file_path: t.file.file_size_in_bytes for t in tbl.scan().plan_files()
               if t.file.file_path not in before}
        second = warm_window(settings, "samples", 2, end3 + timedelta(days=1),
                             tbl.current_snapshot().snapshot_id, None, None)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    copied_data = sorted(p for p in second.copied_paths if p.endswith(".parquet"))
    return {
        "first_run_copied": first.copied, "first_run_bytes": first.bytes,
        "rerun_copied": second.copied, "rerun_bytes": second.bytes,
        "rerun_copied_data_files": len(copied_data), "new_day_data_files": len(new),
        "new_day_data_bytes": sum(new.values()),
        "rerun_metadata_bytes": second.bytes - sum(new.get(p, 0) for p in copied_data),
        "only_new_files": copied_data == sorted(new),
        "rerun_evicted": second.evicted, "rerun_already_cached": second.already_cached,
    }


def _upload(endpoint: Any, prefix: str, count: int, size: int, threads: int) -> list[str]:
    """`count` distinct files of `size` bytes under s3://<bucket>/<prefix>/."""
    import os

    from slipstream.cache.remote import filesystem_for

    uris = [f"s3://{endpoint.bucket}/{prefix}/part-{i:05d}.bin" for i in range(count)]
    fs, _ = filesystem_for(uris[0], endpoint.io_properties())
    payload = os.urandom(size + count)

    def put(i: int) -> None:
        with fs.open_output_stream(uris[i].removeprefix("s3://")) as out:
            out.write(payload[i:i + size])

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, range(count)))
    return uris


def main(argv: list[str]) -> dict[str, Any]:
    args = _parse(argv)
    from slipstream.dev.s3server import S3Server

    thread_counts = [int(t) for t in args.threads.split(",")]
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="slipstream-bench-warmup-"))
    server = S3Server(workdir / "s3home")
    try:
        ep = server.start()
        io = ep.io_properties()
        t, small = _timed(lambda: _upload(ep, "small", args.files, args.file_kb * 1024, 32))
        log.info("uploaded %d small files in %.1fs", args.files, t)
        large = _upload(ep, "large", args.large_files, args.large_mb << 20, 4)
        s = _window_case("small", small, args.file_kb * 1024, io, workdir / "cache", thread_counts, args.rounds)
        big = _window_case("large", large, args.large_mb << 20, io, workdir / "cache", thread_counts, args.rounds)
        inc = _incremental_case(workdir, ep)
    finally:
        server.stop()
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return {
        "small_speedup": s["speedup"], "large_speedup": big["speedup"],
        "copy_vs_raw": s["copy_vs_raw"], "copy_vs_raw_large": big["copy_vs_raw"],
        "copy_vs_raw_copy": s["copy_vs_raw_copy"], "copy_vs_raw_copy_large": big["copy_vs_raw_copy"],
        "incremental_rerun_bytes": inc["rerun_bytes"], "incremental_only_new_files": inc["only_new_files"],
        "small": s, "large": big, "incremental": inc,
    }
