"""The stop flag a signal sets, what a second signal does, the loopback-only stores, and what the
elastic launcher refuses — without a job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

from trainers.parallel.graceful_stop import EXIT_STOPPED, GracefulStop, StopRequest

REPO = Path(__file__).resolve().parents[3]


def test_the_first_signal_only_sets_the_flag() -> None:
    request = StopRequest()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        request.install()
        assert not request.requested and request.wish() == 0.0
        os.kill(os.getpid(), signal.SIGTERM)  # handled in this (main) thread before the next line
        assert request.requested and request.signal == "SIGTERM" and request.wish() == 1.0
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    stop = GracefulStop(step=12, checkpoint="ckpt/step-12", ranks=2)
    assert "step 12" in str(stop) and "2 rank(s)" in str(stop) and EXIT_STOPPED == 3


def test_a_second_signal_ends_the_process_at_once() -> None:
    code = ("import os, signal, time\n"
            "from trainers.parallel.graceful_stop import REQUEST\n"
            "REQUEST.install()\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "print('still here', REQUEST.signal, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30)\n"
            "print('not reached', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "still here SIGTERM"
    assert done.returncode == -signal.SIGTERM


def test_a_loopback_store_listens_on_its_address_only() -> None:
    import torch.distributed as dist

    from trainers.parallel.loopback import host_store, is_loopback

    assert is_loopback("127.0.0.3") and is_loopback("localhost") and is_loopback("[::1]") and not is_loopback("10.0.0.1")
    server = host_store("127.0.0.2", 0, None, timedelta(seconds=10))
    client = dist.TCPStore("127.0.0.2", server.port, None, False, timedelta(seconds=10))
    client.set("k", "v")
    assert server.get("k") == b"v"
    listening = [c.laddr for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    assert [a.ip for a in listening if a.port == server.port] == ["127.0.0.2"]


def test_the_group_store_is_torchs_own_unless_rank_0_hosts_it_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainers.parallel.dist import loopback_group_store

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # the agent's store: torch's env:// path
    assert loopback_group_store(0, 2, timedelta(seconds=5)) is None
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")  # a cluster address: torch's own
    assert loopback_group_store(0, 2, timedelta(seconds=5)) is None
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    store = loopback_group_store(0, 1, timedelta(seconds=5))
    assert store is not None
    store.set("a", "b")
    assert store.get("a") == b"b"


@pytest.mark.parametrize("argv", [["--", "--standalone", "--nproc-per-node", "1", "-m", "trainers.train"],
                                  ["--", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:1", "-m", "other.module"]])
def test_the_launcher_refuses_a_standalone_rendezvous_or_another_program(argv: list[str],
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from trainers.launch import main

    assert main(argv) == 2
    assert "no --standalone" in capsys.readouterr().err
