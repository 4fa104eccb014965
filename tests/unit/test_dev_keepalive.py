"""The local stack's keepalive wrapper, with real processes: a server that fails on its own is
started again (a bounded number of times), one that is stopped is not, and stopping the wrapper's
process group (what `slipstream ui down` does) ends the program too."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from slipstream.processes import pid_alive, start_process, stop_process

# counts its starts in a file; fails the first `fail` starts, then records its pid and sleeps
PROGRAM = """
import os, sys, time
from pathlib import Path
starts = Path(sys.argv[1]); fail = int(sys.argv[2])
n = int(starts.read_text() or 0) + 1 if starts.exists() else 1
starts.write_text(str(n))
if n <= fail:
    sys.exit(3)
Path(sys.argv[3]).write_text(str(os.getpid()))
time.sleep(120)
"""


def _keepalive(tmp_path: Path, fail: int, *extra: str) -> tuple[list[str], Path, Path]:
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    starts, pidfile = tmp_path / "starts", tmp_path / "pid"
    argv = [sys.executable, "-m", "slipstream.dev.keepalive", "demo-server", "--backoff-s", "0.1", *extra, "--",
            sys.executable, str(prog), str(starts), str(fail), str(pidfile)]
    return argv, starts, pidfile


def _wait_for(path: Path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"{path} never written")


def test_a_failed_server_is_restarted_and_stopping_the_group_ends_it(tmp_path: Path) -> None:
    argv, starts, pidfile = _keepalive(tmp_path, fail=2)
    wrapper = start_process("demo-server", argv, tmp_path / "keepalive.log", {"PYTHONPATH": os.getcwd()})
    try:
        child = int(_wait_for(pidfile))
        assert starts.read_text() == "3"  # failed twice, restarted twice, running the third time
        assert pid_alive(wrapper) and pid_alive(child)
        log = (tmp_path / "keepalive.log").read_text()
        assert "demo-server exited with status 3; restarting it (2 of at most 5 in 600 s)" in log
    finally:
        stop_process(wrapper, timeout_s=10)
    assert not pid_alive(wrapper)
    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(child)
    assert starts.read_text() == "3"  # a stop is not a failure: no restart after it


def test_a_server_failing_on_every_start_is_given_up_with_its_status(tmp_path: Path) -> None:
    argv, starts, _ = _keepalive(tmp_path, 100, "--max-restarts", "2")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 3 and starts.read_text() == "3"  # the first start and two restarts
    assert "its 2 restart(s) in the last 600 s used up: giving up" in out.stderr
