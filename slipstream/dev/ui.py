"""`make ui`: Airflow's api-server, scheduler, dag-processor and triggerer on 127.0.0.1.

Each component starts on its own (Airflow's `standalone` binds log servers on 0.0.0.0 and ignores
SIGTERM in its children), with the embedded stack's environment (`slipstream.dev.stack.airflow_env`);
each is recorded in the stack's `stack.json` so `slipstream ui down` (and `stack down`) stop
exactly those processes by PID. Login is Airflow 3's simple auth manager with one admin user whose
password is written to the passwords file before the api-server starts (SLIPSTREAM_UI_PASSWORD,
or a random one kept under AIRFLOW_HOME), so the URL and login can be printed. The scheduler,
dag-processor and triggerer are restarted when they fail (`slipstream.dev.keepalive`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from slipstream.dev.stack import (
    ServiceState,
    StackState,
    _bin,
    airflow_env,
    free_port,
    port_open,
)
from slipstream.errors import StackError
from slipstream.processes import pid_alive, start_process, stop_process
from slipstream.settings import Settings, write_private_file

log = logging.getLogger(__name__)

COMPONENTS: dict[str, list[str]] = {
    "airflow-api-server": ["api-server", "-H", "127.0.0.1", "-p", "{port}", "--workers", "1"],
    "airflow-scheduler": ["scheduler", "--skip-serve-logs"],
    "airflow-dag-processor": ["dag-processor"],
    "airflow-triggerer": ["triggerer", "--skip-serve-logs"],
}
# kept running by slipstream.dev.keepalive: these exit when one of their loops fails (e.g. on a run
# that `airflow backfill create` deleted under them); the api-server serves requests and stays up
KEEP_ALIVE = ("airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
ADMIN_USER = "admin"
DEFAULT_PORT = 8080


@dataclass(frozen=True)
class UiInfo:
    url: str
    username: str
    password: str
    pids: dict[str, int]
    logs: str


def _secret(path: Path, nbytes: int = 24) -> str:
    """A random value kept in a file under AIRFLOW_HOME (the same across restarts of the UI)."""
    if path.exists():
        return path.read_text().strip()
    value = secrets.token_urlsafe(nbytes)
    write_private_file(path, value + "\n")
    return value


def ui_env(settings: Settings, port: int, password: str) -> dict[str, str]:
    """airflow_env plus what the UI components share: API address, login, JWT secret."""
    env = airflow_env(settings)
    home = Path(env["AIRFLOW_HOME"])
    passwords = write_private_file(home / "simple_auth_manager_passwords.json", json.dumps({ADMIN_USER: password}) + "\n")
    base = f"http://127.0.0.1:{port}"
    env.update({
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base,
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        # every component must sign and verify the same task/API tokens
        "AIRFLOW__API_AUTH__JWT_SECRET": _secret(home / ".jwt_secret"),
        "AIRFLOW__API__SECRET_KEY": _secret(home / ".api_secret_key"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
    })
    return env


def wait_healthy(url: str, pid: int, log_path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            raise StackError(f"the Airflow api-server exited at start; see {log_path}")
        try:
            with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise StackError(f"the Airflow api-server did not answer at {url} within {timeout_s:.0f}s; see {log_path}")


def up(settings: Settings, *, port: int | None = None, password: str | None = None, timeout_s: float = 180.0) -> UiInfo:
    """Start the four components (the stack's Kafka and catalog first, if not running)."""
    from slipstream.dev import stack

    state = stack.up(settings, airflow=True)
    try:
        return _start_components(settings, state, port, password, timeout_s)
    except BaseException:  # also the broker (and S3 server) this call started for the UI
        stack.stop_started(settings.home, state)
        raise


def _start_components(settings: Settings, state: StackState, port: int | None, password: str | None,
                      timeout_s: float) -> UiInfo:
    running = {n: s for n, s in state.services.items() if n in COMPONENTS and pid_alive(s.pid)}
    home = settings.home / "airflow"
    password = password or os.environ.get("SLIPSTREAM_UI_PASSWORD") or _secret(home / ".ui_password", 12)
    if running:
        url = running["airflow-api-server"].address if "airflow-api-server" in running else ""
        log.info("the UI is already running: %s", ", ".join(f"{n} (pid {s.pid})" for n, s in running.items()))
        return UiInfo(url, ADMIN_USER, password, {n: s.pid for n, s in running.items()}, str(settings.home / "logs"))
    port = port or int(os.environ.get("SLIPSTREAM_UI_PORT") or DEFAULT_PORT)
    if port_open("127.0.0.1", port):
        raise StackError(f"port {port} on 127.0.0.1 is in use: set SLIPSTREAM_UI_PORT to a free port")
    env = ui_env(settings, port, password)
    url = f"http://127.0.0.1:{port}"
    airflow = _bin("airflow")
    pids: dict[str, int] = {}
    try:
        for name, args in COMPONENTS.items():
            log_path = settings.home / "logs" / f"{name}.log"
            argv = [airflow, *(a.format(port=port) for a in args)]
            if name in KEEP_ALIVE:
                argv = [sys.executable, "-m", "slipstream.dev.keepalive", name, "--", *argv]
            pid = start_process(name, argv, log_path, env)
            pids[name] = pid
            state.services[name] = ServiceState(name, pid, url if name == "airflow-api-server" else "", str(log_path))
            state.save(settings.home)
            if name == "airflow-api-server":
                wait_healthy(url, pid, str(log_path), timeout_s)
    except BaseException:
        for name, pid in pids.items():
            stop_process(pid)
            state.services.pop(name, None)
        state.save(settings.home)
        raise
    return UiInfo(url, ADMIN_USER, password, pids, str(settings.home / "logs"))


def down(settings: Settings) -> list[str]:
    """Stop the UI components by the PIDs `up` recorded; the Kafka broker keeps running."""
    from concurrent.futures import ThreadPoolExecutor

    state = StackState.load(settings.home)
    services = [svc for name in reversed(list(COMPONENTS)) if (svc := state.services.pop(name, None)) is not None]
    # in parallel: each stop may wait out its grace period before SIGKILL
    with ThreadPoolExecutor(max_workers=len(COMPONENTS)) as pool:
        list(pool.map(lambda svc: stop_process(svc.pid), services))
    state.save(settings.home)
    return [f"{svc.name} (pid {svc.pid})" for svc in services]
