"""Every command that starts a server stops it when it is interrupted (SIGTERM, as `kill` sends)
or fails half-way (issue 23, item 5): none leaves a broker, S3 server or JVM listening."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.airflow_fixtures import migrated_airflow_db, use_airflow_db  # noqa: F401
from tests.trainer_fixtures import REPO, free_port

pytestmark = pytest.mark.integration


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLIPSTREAM_")}
    env.update({"SLIPSTREAM_HOME": str(home), "SLIPSTREAM_KAFKA_PORT": str(free_port()),
                "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'plugins'}", **extra})
    return env


def _servers(pid: int, names: tuple[str, ...]) -> list[psutil.Process]:
    """Descendants of `pid` that are one of the servers (by a word of their command line)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for k in kids:
        try:
            if any(n in " ".join(k.cmdline()) for n in names):
                out.append(k)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return out


def _gone(procs: list[psutil.Process], timeout_s: float = 30) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.2)
    return alive


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


COMMANDS = {
    "bench stream": (["bench", "stream", "--samples", "20000", "--repeat", "1"], ("noida",)),
    "bench model_quality": (["bench", "model_quality", "--scenario", "stationary", "--per-day", "20000"], ("noida",)),
    "demo": (["demo", "--days", "1", "--impressions-per-day", "2000"], ("noida",)),
    "bench preprocess": (["bench", "preprocess", "--impressions", "5000", "--scale", "1"], ("java",)),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_sigterm_stops_the_servers_a_command_started(tmp_path: Path, name: str) -> None:
    args, servers = COMMANDS[name]
    if "java" in servers and shutil.which("java") is None:
        pytest.skip("Java 17 is needed by Spark")
    proc = subprocess.Popen([sys.executable, "-m", "slipstream.cli", *args], env=_env(tmp_path / "home"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "cmd.log", "wb"), start_new_session=True)
    seen: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 180
        while not seen:
            assert proc.poll() is None, (tmp_path / "cmd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"{name} started no server"
            seen = _servers(proc.pid, servers)
            time.sleep(0.1)
        time.sleep(1.0)  # the server is up (or still starting: both must be stopped)
        seen = _servers(proc.pid, servers) or seen
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(120)
        left = _gone(seen)
        assert not left, f"{name} left {[' '.join(p.cmdline()[:3]) for p in left]} running after SIGTERM"
        assert rc != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _kill(seen)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slipstream.cli", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_stack_up_failing_half_way_stops_the_broker_it_started(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = _env(home, SLIPSTREAM_CATALOG="no-such-catalog")  # the broker starts, the catalog step fails
    port = int(env["SLIPSTREAM_KAFKA_PORT"])
    out = _cli(["stack", "up", "--no-airflow"], env)
    try:
        assert out.returncode != 0
        assert not _listening(port), "the broker stack up started is still listening"
        assert json.loads((home / "stack.json").read_text())["services"] == {}
        assert not (home / "settings.env").exists()
    finally:
        for svc in json.loads((home / "stack.json").read_text()).get("services", {}).values():
            _kill([psutil.Process(svc["pid"])] if psutil.pid_exists(svc["pid"]) else [])


def test_ui_up_failing_half_way_stops_the_broker_it_started(tmp_path: Path, migrated_airflow_db: Path) -> None:  # noqa: F811
    home = tmp_path / "home"
    use_airflow_db(migrated_airflow_db, home)
    env = _env(home)
    port = int(env["SLIPSTREAM_KAFKA_PORT"])
    with socket.socket() as taken:  # the UI's port is held by someone else
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        out = _cli(["ui", "up", "--port", str(taken.getsockname()[1])], env)
    try:
        assert out.returncode == 2 and "is in use" in out.stderr, out.stderr[-2000:]
        assert not _listening(port), "the broker ui up started is still listening"
        assert json.loads((home / "stack.json").read_text())["services"] == {}
    finally:
        for svc in json.loads((home / "stack.json").read_text()).get("services", {}).values():
            _kill([psutil.Process(svc["pid"])] if psutil.pid_exists(svc["pid"]) else [])
