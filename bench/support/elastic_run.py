"""Drive an elastic job on this machine the way a person does: `slipstream elastic start|join`,
then membership changes by the same calls the `activate` and `leave` commands make, a node that
dies by SIGKILL, and waits on what the run writes (`worlds.jsonl`, checkpoints). Used by
`bench elastic` and the elastic tests; it stops everything it started, by pid, when closed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import psutil

from slipstream.pipeline import elastic

T = TypeVar("T")


class ElasticRun:
    def __init__(self, run_path: Path, env: Mapping[str, str], cwd: Path, log_dir: Path) -> None:
        self.run_path, self.env, self.cwd, self.log_dir = run_path, dict(env), cwd, log_dir
        self.base: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def cli(self, *args: str, timeout_s: float = 120) -> str:
        """`slipstream <args>`; returns its stdout (raises with its stderr when it fails)."""
        done = subprocess.run([sys.executable, "-m", "slipstream.cli", *args], env=self.env, cwd=self.cwd,
                              capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"slipstream {' '.join(args)} exited {done.returncode}: {done.stderr[-3000:]}")
        return done.stdout

    # --- membership -------------------------------------------------------------------------
    def start(self, trainer_args: list[str], *, max_nodes: int, nproc_per_node: int = 1, max_restarts: int = 3,
              stop_grace_s: int = 60) -> None:
        """Launcher 0 as a standby (`slipstream elastic start --standby`), in its own session."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_dir / "launcher-0.log", "ab")
        self.base = subprocess.Popen(
            [sys.executable, "-m", "slipstream.cli", "elastic", "start", self.run_path.name, "--standby",
             "--max-nodes", str(max_nodes), "--nproc-per-node", str(nproc_per_node), "--max-restarts",
             str(max_restarts), "--stop-grace-s", str(stop_grace_s), *trainer_args],
            env=self.env, cwd=self.cwd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_for(lambda: (elastic.job_dir(self.run_path) / elastic.JOB_FILE).exists(), "launcher 0 to load", 600)

    def join_standby(self, count: int) -> list[int]:
        """`slipstream elastic join --standby`, `count` times; their launcher numbers."""
        return [int(json.loads(self.cli("elastic", "join", self.run_path.name, "--standby"))["index"]) for _ in range(count)]

    def wait_loaded(self, count: int, timeout_s: float = 600) -> None:
        self.wait_for(lambda: len([la for la in elastic.launchers(self.run_path) if la.ready]) >= count,
                      f"{count} launchers to load their code", timeout_s)

    def activate(self, index: int | None = None) -> float:
        """Let standby launchers join (all, or one); the time they were told to."""
        at = time.time()
        elastic.activate(self.run_path, index)
        return at

    def leave(self, index: int) -> float:
        """SIGTERM launcher `index` (what `slipstream elastic leave --launcher N` does); the time."""
        at = time.time()
        elastic.leave(self.run_path, index)
        return at

    def kill(self, index: int, *, tree: bool = True) -> tuple[float, list[int]]:
        """SIGKILL launcher `index` and everything it started at once (a machine lost), or the launcher
        alone (`tree=False`: an OOM kill of the node's agent); the time, and its workers' pids (the
        children of its forkserver)."""
        launcher = next(la for la in elastic.launchers(self.run_path) if la.index == index)
        started = psutil.Process(launcher.pid).children(recursive=True)
        workers = [w.pid for child in psutil.Process(launcher.pid).children() for w in child.children()]
        procs = [psutil.Process(launcher.pid), *(started if tree else [])]
        at = time.time()
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        return at, workers

    # --- what the run wrote --------------------------------------------------------------------
    def worlds(self) -> list[dict[str, Any]]:
        return elastic.read_worlds(self.run_path)

    def first_step(self, world: int, after: float) -> dict[str, Any] | None:
        """The `first_step` event of a world of size `world` that started after `after`."""
        for e in self.worlds():
            if e["event"] == "first_step" and e["world"] == world and e["time"] >= after:
                return e
        return None

    def wait_world(self, world: int, after: float, timeout_s: float = 300) -> dict[str, Any]:
        return self.wait_for(lambda: self.first_step(world, after), f"a world of {world} to take a step", timeout_s)

    def checkpoint_meta(self) -> dict[str, Any] | None:
        root = self.run_path / "checkpoint"
        try:
            return json.loads((root / (root / "latest").read_text().strip() / "meta.json").read_text())
        except (OSError, ValueError):
            return None

    def wait_for(self, probe: Callable[[], T | None], what: str, timeout_s: float) -> T:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = probe()
            if got:
                return got
            if self.base is not None and self.base.poll() is not None:
                raise AssertionError(f"launcher 0 exited ({self.base.returncode}) while waiting for {what}; "
                                     f"see {self.log_dir}")
            time.sleep(0.05)
        raise AssertionError(f"no {what} within {timeout_s:.0f}s; see {self.log_dir}")

    def wait(self, timeout_s: float = 600) -> int:
        """Launcher 0's exit status (the job's)."""
        assert self.base is not None
        return self.base.wait(timeout_s)

    def close(self) -> None:
        """SIGKILL every launcher still running (and its workers), by the pids the job recorded."""
        pids = [la.pid for la in elastic.launchers(self.run_path) if la.alive]
        if self.base is not None and self.base.poll() is None:
            pids.append(self.base.pid)
        for pid in pids:
            try:
                procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for p in procs:
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
        if self.base is not None:
            try:
                self.base.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.base.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
