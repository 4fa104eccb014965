"""`slipstream bench warmup --json --rtt-ms 5`: does warming the cache pay off against a remote
store with real latency, how close does the warmup come to the store's best raw transfer rate,
and how close do reads through the cache come to reading local files?

A SeaweedFS S3 server runs on 127.0.0.1 for the run; the "remote" is that server behind a TCP
relay (`bench/support/relay.py`) that delays each direction by half of `--rtt-ms` (5 ms: in-region; 50 ms:
cross-region). The same measurements are repeated against the server directly (`no_delay`,
unless `--no-baseline`), and the relay's own cost at no delay is measured against a direct
connection (`relay.no_delay_vs_direct_*`; `relay.cores_at_rtt`: the relay's CPU during the
measurements, 1.0 would mean its one thread is the bottleneck). Every ratio compares two timings
taken in the same run:

- small window, `--files` x `--file-kb` KB (default 10,000 x 20 KB, the Weibo case), and large
  window, `--large-files` x `--large-mb` MB (default 8 x 32 MB);
- raw side: the best raw parallel GETs at hand, the one-GET client the warmup uses (bytes
  dropped, no checksum) at each `--threads` count, and for the large window also ranged GETs at
  8/16/32 in flight: the fastest is the raw side;
- `copy_vs_raw` (small) / `large_copy_vs_raw`: `--rounds` rounds of raw GET, warmup (default
  knobs: concurrency `auto`), raw GET of the same files (raw time = the mean of the two, so a load
  change during a round hits both sides); the median over rounds of raw time / warmup time. Small
  rounds take 1/rounds of the window each, large rounds the whole window (evicted in between).
  `copy_vs_raw_copy`: the same against a plain GET-and-write-a-file script;
- `small_speedup` / `large_speedup`: the window read remote (the faster of a cold `CacheReader`,
  every read a miss through pyarrow, and the raw GETs of the rounds) vs read through the warm cache
  with `CacheReader.open_input_file`, the call the trainer's loader makes (best of 5, one thread);
- `vs_local`: reading the window from local files directly (pyarrow's local filesystem, the same
  call) vs through the warm cache, best of 5 each, alternately; the smaller of small and large
  (`vs_local_small`, `vs_local_large`: 1 = the cache costs what local files cost);
- `costs`: per small file and per MB, remote, raw, warmup, cached and local;
- `incremental_only_new_files`: an Iceberg table warmed, one day appended, the re-run copies only
  that day's data file (against the server directly).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from functools import partial
from pathlib import Path
from typing import Any

from bench.support.remote_store import RemoteStore, stop_on_signals
from bench.support.warmup_cases import Window, measure_window, raw_get, timed
from slipstream.cache.settings import WarmKnobs

log = logging.getLogger(__name__)

GOALS = {"small_speedup": 20.0, "copy_vs_raw": 0.9, "large_copy_vs_raw": 0.8, "vs_local": 0.8}
"""Goals at an in-region round trip (5 ms)."""


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slipstream bench warmup")
    p.add_argument("--rtt-ms", type=float, default=5.0, help="round trip of the remote store (0: direct)")
    p.add_argument("--files", type=int, default=10_000, help="small files in the small window")
    p.add_argument("--file-kb", type=int, default=20)
    p.add_argument("--large-files", type=int, default=8)
    p.add_argument("--large-mb", type=int, default=32)
    p.add_argument("--threads", default="auto",
                   help="thread counts tried for the raw GETs (auto: 8,16,32,64,128, and 256 from 20 ms)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved raw GET / warmup rounds (ratios are their median)")
    p.add_argument("--no-baseline", action="store_true", help="skip the no-delay figures")
    p.add_argument("--no-incremental", action="store_true", help="skip the Iceberg incremental re-run check")
    p.add_argument("--workdir", help="where the S3 data and the caches go (default: a temp folder, removed)")
    p.add_argument("--json", action="store_true", help="accepted for `slipstream bench warmup --json` (output is JSON anyway)")
    return p.parse_args(argv)


def _thread_counts(spec: str, rtt_ms: float) -> list[int]:
    if spec != "auto":
        return [int(t) for t in spec.split(",")]
    return [8, 16, 32, 64, 128] + ([256] if rtt_ms >= 20 else [])


def _upload(store: RemoteStore, workdir: Path, prefix: str, count: int, size: int) -> Window:
    """`count` distinct files of `size` bytes, in the bucket and (the same bytes) on local disk."""
    from slipstream.cache.remote import filesystem_for

    ep = store.endpoint(0)
    uris = [f"s3://{ep.bucket}/{prefix}/part-{i:05d}.bin" for i in range(count)]
    local_dir = workdir / "local" / prefix
    local_dir.mkdir(parents=True, exist_ok=True)
    local = [str(local_dir / f"part-{i:05d}.bin") for i in range(count)]
    fs, _ = filesystem_for(uris[0], ep.io_properties())
    payload = os.urandom(size + count)

    def put(i: int) -> None:
        with fs.open_output_stream(uris[i].removeprefix("s3://")) as out:
            out.write(payload[i:i + size])
        with open(local[i], "wb") as fh:
            fh.write(payload[i:i + size])

    with ThreadPoolExecutor(32 if size < 1 << 20 else 4) as pool:
        list(pool.map(put, range(count)))
    return Window("small" if size < 1 << 20 else "large", uris, size, local)


def _ping_ms(io: dict[str, str], uri: str, n: int = 15) -> float:
    """Median time of one small GET on a kept-alive connection: the round trip plus the store."""
    from slipstream.cache.s3get import S3Getter

    getter = S3Getter(io)
    times = [timed(lambda: getter.get(uri[5:], lambda c: None, lambda e: None))[0] for _ in range(n + 1)]
    return statistics.median(times[1:]) * 1000


def _relay_cost(store: RemoteStore, small: Window, large: Window) -> dict[str, Any]:
    """The relay with no delay against a direct connection: raw GETs of 1/5 of the small window
    (32 threads) and of the large window (a thread per file), alternately, best of 2 each."""
    from slipstream.cache.s3get import S3Getter

    sides = {"direct": S3Getter(store.endpoint(0).io_properties()),
             "relay": S3Getter(store.endpoint(0, relay_when_zero=True).io_properties())}
    sample = small.uris[::5]
    best: dict[str, dict[str, float]] = {k: {"files_per_s": 0.0, "mb_per_s": 0.0} for k in sides}
    for _ in range(2):
        for side, getter in sides.items():
            s, _ = timed(partial(raw_get, getter, sample, 32))
            best[side]["files_per_s"] = max(best[side]["files_per_s"], len(sample) / s)
            s, nbytes = timed(partial(raw_get, getter, large.uris, len(large.uris)))
            best[side]["mb_per_s"] = max(best[side]["mb_per_s"], nbytes / s / 1e6)
    return {
        "no_delay_vs_direct_small": round(best["relay"]["files_per_s"] / best["direct"]["files_per_s"], 3),
        "no_delay_vs_direct_large": round(best["relay"]["mb_per_s"] / best["direct"]["mb_per_s"], 3),
        **{f"{side}_{k}": round(v, 1) for side, b in best.items() for k, v in b.items()},
    }


def _phase(store: RemoteStore, rtt_ms: float, small: Window, large: Window, workdir: Path, args: argparse.Namespace,
           knobs: WarmKnobs) -> dict[str, Any]:
    """Both windows at one round trip; the headline fields first, then the details."""
    io = store.endpoint(rtt_ms).io_properties()
    threads = _thread_counts(args.threads, rtt_ms)
    s = measure_window(small, io, workdir / f"rtt-{rtt_ms:g}", threads, args.rounds, knobs)
    big = measure_window(large, io, workdir / f"rtt-{rtt_ms:g}", threads, args.rounds, knobs)
    return {
        "small_speedup": s["speedup"], "copy_vs_raw": s["copy_vs_raw"],
        "large_copy_vs_raw": big["copy_vs_raw"], "vs_local": min(s["vs_local"], big["vs_local"]),
        "vs_local_small": s["vs_local"], "vs_local_large": big["vs_local"], "large_speedup": big["speedup"],
        "copy_vs_raw_copy": s["copy_vs_raw_copy"], "large_copy_vs_raw_copy": big["copy_vs_raw_copy"],
        "warm_concurrency": {"small": s["warm_concurrency"], "large": big["warm_concurrency"]},
        "costs": {"small": s["costs"], "large": big["costs"]},
        "small": s, "large": big,
    }


def _incremental_case(workdir: Path, store: RemoteStore) -> dict[str, Any]:
    """A 2-day window of an Iceberg `samples` table warmed, one day appended, warmed again."""
    from datetime import date, datetime, timedelta

    from slipstream.cache.warm import warm_window
    from slipstream.dev.datagen import GeneratorConfig, reference_samples
    from slipstream.lake.iceberg import get_catalog, samples_table
    from slipstream.settings import Settings

    endpoint = store.endpoint(0)
    days = list(reference_samples(GeneratorConfig(start_day=date(2026, 3, 1), days=4, impressions_per_day=2000)).values())
    settings = Settings(home=workdir / "home", warehouse=endpoint.warehouse("bench-wh"), cache_dir=str(workdir / "icache"),
                        s3_endpoint=endpoint.url, s3_access_key_id=endpoint.access_key,
                        s3_secret_access_key=endpoint.secret_key, s3_region=endpoint.region)
    tbl = samples_table(get_catalog(settings), settings.namespace)
    for d in days[:3]:
        tbl.append(d)
    end3 = datetime(2026, 3, 4, tzinfo=UTC)
    before = {t.file.file_path for t in tbl.scan().plan_files()}
    snap3 = tbl.current_snapshot()
    assert snap3 is not None, "three days were just appended"
    first = warm_window(settings, "samples", 2, end3, snap3.snapshot_id, None, None)
    tbl.append(days[3])
    new = {t.file.file_path: t.file.file_size_in_bytes for t in tbl.scan().plan_files() if t.file.file_path not in before}
    snap4 = tbl.current_snapshot()
    assert snap4 is not None, "a fourth day was just appended"
    second = warm_window(settings, "samples", 2, end3 + timedelta(days=1), snap4.snapshot_id, None, None)
    copied_data = sorted(p for p in second.copied_paths if p.endswith(".parquet"))
    return {
        "first_run_copied": first.copied, "rerun_copied": second.copied, "rerun_bytes": second.bytes,
        "rerun_copied_data_files": len(copied_data), "new_day_data_files": len(new),
        "new_day_data_bytes": sum(new.values()), "only_new_files": copied_data == sorted(new),
    }


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str]) -> dict[str, Any]:
    args = _parse(argv)
    knobs = WarmKnobs.from_env(os.environ)  # SLIPSTREAM_CACHE_CONCURRENCY, _BLOCK_BYTES, ... as for a warmup
    t0, load_start = time.monotonic(), _load()
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="slipstream-bench-warmup-"))
    try:
        with stop_on_signals(), RemoteStore(workdir) as store:
            log.info("bench warmup: S3 server up (pids %s); uploading", store.pids())
            small = _upload(store, workdir, "small", args.files, args.file_kb * 1024)
            large = _upload(store, workdir, "large", args.large_files, args.large_mb << 20)
            direct_ms = _ping_ms(store.endpoint(0).io_properties(), small.uris[0])
            relay = _relay_cost(store, small, large)
            out: dict[str, Any] = {"rtt_ms": args.rtt_ms, "knobs": knobs.as_env()}
            if args.rtt_ms > 0:
                ep = store.endpoint(args.rtt_ms)
                out["rtt_measured_ms"] = round(_ping_ms(ep.io_properties(), small.uris[0]) - direct_ms, 2)
            log.info("bench warmup: measuring at %g ms", args.rtt_ms)
            relay_cpu, t_phase = store.relay_cpu_s(args.rtt_ms), time.monotonic()
            phase = _phase(store, args.rtt_ms, small, large, workdir, args, knobs)
            if args.rtt_ms > 0:  # a single-threaded relay would be the bottleneck at 1.0
                relay["cores_at_rtt"] = round((store.relay_cpu_s(args.rtt_ms) - relay_cpu) / (time.monotonic() - t_phase), 3)
            out.update({k: v for k, v in phase.items() if k not in ("small", "large")})
            out["goals"] = GOALS
            out["goals_met"] = {k: bool(out[k] >= v) for k, v in GOALS.items()}
            out["relay"] = relay
            if args.rtt_ms > 0 and not args.no_baseline:
                log.info("bench warmup: measuring with no delay")
                base = _phase(store, 0, small, large, workdir, args, knobs)
                out["no_delay"] = {k: v for k, v in base.items() if k not in ("small", "large")}
            if not args.no_incremental:
                inc = _incremental_case(workdir, store)
                out["incremental_only_new_files"] = inc["only_new_files"]
                out["incremental_rerun_bytes"] = inc["rerun_bytes"]
                out["incremental"] = inc
            out["small"], out["large"] = phase["small"], phase["large"]
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    out["load"] = {"start": load_start, "end": _load()}
    out["seconds"] = round(time.monotonic() - t0, 1)
    return out
