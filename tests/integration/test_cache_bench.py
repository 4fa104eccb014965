"""`slipstream bench warmup` end to end at small sizes: through the latency relay it reports every
field the issue asks for, with sane values (no timed goals: the machine is shared); killed with
SIGTERM, it leaves no server or relay behind and its ports closed."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SMALL = ["--files", "200", "--file-kb", "8", "--large-files", "2", "--large-mb", "9", "--rounds", "2",
         "--threads", "8,16"]


def test_bench_warmup_through_the_relay_reports_sane_fields(tmp_path: Path) -> None:
    from bench.warmup import GOALS, main

    out = main(["--rtt-ms", "5", *SMALL, "--workdir", str(tmp_path)])
    assert out["rtt_ms"] == 5.0
    assert out["rtt_measured_ms"] >= 2.5, "the relay delays each round trip (a lower bound: load only adds)"
    for phase in (out, out["no_delay"]):
        for key in ("small_speedup", "copy_vs_raw", "large_copy_vs_raw", "vs_local", "vs_local_small",
                    "vs_local_large", "large_speedup", "copy_vs_raw_copy", "large_copy_vs_raw_copy"):
            assert isinstance(phase[key], float) and math.isfinite(phase[key]) and phase[key] > 0, (key, phase[key])
        assert phase["vs_local"] == min(phase["vs_local_small"], phase["vs_local_large"])
        small, large = phase["costs"]["small"], phase["costs"]["large"]
        assert set(small) == {"remote_ms_per_file", "raw_ms_per_file", "warm_ms_per_file",
                              "cached_us_per_file", "local_us_per_file"}
        assert set(large) == {"remote_ms_per_mb", "raw_ms_per_mb", "warm_ms_per_mb", "cached_ms_per_mb",
                              "local_ms_per_mb"}
        assert all(v > 0 for v in [*small.values(), *large.values()])
        assert all(n >= 1 for n in phase["warm_concurrency"]["small"] + phase["warm_concurrency"]["large"])
    assert set(out["goals_met"]) == set(GOALS) and out["knobs"]["SLIPSTREAM_CACHE_CONCURRENCY"] == "auto"
    assert 0 < out["relay"]["no_delay_vs_direct_small"] and 0 < out["relay"]["no_delay_vs_direct_large"]
    assert out["small"]["files"] == 200 and len(out["small"]["rounds"]) == 2
    assert out["incremental_only_new_files"] is True


def _listening_ports(procs: list[psutil.Process]) -> set[int]:
    ports = set()
    for p in procs:
        try:
            ports |= {c.laddr.port for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    return ports


def test_sigterm_stops_the_s3_server_and_the_relays(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "slipstream.cli", "bench", "warmup", "--rtt-ms", "5", *SMALL[:-4], "--files", "3000",
         "--file-kb", "4", "--workdir", str(tmp_path)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'plugins'}"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            children = psutil.Process(proc.pid).children(recursive=True)
            relays = [c for c in children if "--rtt-ms" in " ".join(c.cmdline()) and "5.0" in c.cmdline()]
            if relays and any("weed" in c.name() for c in children):
                started = children
                break
            time.sleep(0.2)
        assert started, f"the bench did not reach the 5 ms phase: {proc.poll()} {proc.stderr and proc.stderr.read()[-2000:]!r}"
        ports = _listening_ports(started)
        assert ports, "the S3 server and the relays listen"
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr.read()[-3000:] if proc.stderr else ""
    alive = [p.pid for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes the bench started survived: {alive}"
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still accepts connections"
