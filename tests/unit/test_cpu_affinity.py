"""A worker or a process on CPUs of its own: a server started with `cpus` runs there with every
thread it makes, and each local rank of a trainer takes an even share of the node's CPUs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from slipstream.processes import start_process, stop_process, usable_cpus
from trainers.parallel.dist import rank_cpus

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")


def test_a_process_started_on_one_cpu_stays_there_with_its_threads(tmp_path: Path) -> None:
    cpu = usable_cpus()[-1]
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); time.sleep(30)"
    pid = start_process("sleeper", [sys.executable, "-c", code], tmp_path / "sleeper.log", cpus=[cpu])
    try:
        import time

        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tids = os.listdir(f"/proc/{pid}/task")
        assert len(tids) >= 2, "the child started its thread"
        assert all(os.sched_getaffinity(int(t)) == {cpu} for t in tids)
    finally:
        stop_process(pid)


def test_each_local_rank_takes_an_even_share_of_the_cpus() -> None:
    cpus = [0, 1, 2, 3, 4, 5, 6, 7]
    assert [rank_cpus(cpus, r, 2) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [rank_cpus(cpus, r, 3) for r in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert rank_cpus([0, 1], 0, 1) == [0, 1], "one rank keeps every CPU"
    assert [rank_cpus([0, 1], r, 3) for r in range(3)] == [[0], [1], [0]], "fewer CPUs than ranks: one each, round robin"
