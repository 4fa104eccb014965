"""Fixtures and helpers of the Airflow tests (imported by tests/*/test_airflow_*.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
STANDIN_TRAINER = "tests.airflow_standin_trainer"
T_HANDOFF = datetime(2025, 1, 4, tzinfo=UTC)

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: test, user: {token: not-a-secret}}]
contexts: [{name: test, context: {cluster: test, user: test}}]
current-context: test
"""


@pytest.fixture
def kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kubeconfig naming an unreachable API server: enough for the provider to render pods
    (build_pod_request_obj asks the hook whether it runs in a cluster) without contacting one."""
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(path))
    for key in list(os.environ):
        if key.startswith("AIRFLOW_CONN_KUBERNETES"):
            monkeypatch.delenv(key)
    return path


def write_run(runs_dir: Path, run_id: str, auc: float | None, *, baseline: float = 0.5,
              champion: tuple[str, float] | None = None, rows: int = 1000, half_width: float = 0.01) -> Path:
    """A finished run folder as the trainer leaves it (for registry tests that need no training):
    `auc` on `rows` forward-tail rows after T, its logistic baseline's AUC on them (each difference
    with an interval of ± `half_width`), and `champion`: the champion's (run id, AUC) re-scored on the same rows."""
    run = runs_dir / run_id
    (run / "export").mkdir(parents=True, exist_ok=True)
    (run / "export" / "model.pt").write_bytes(b"weights-" + run_id.encode())
    (run / "export" / "model.json").write_text(json.dumps({"schema_version": 1}))
    (run / "config.json").write_text("{}")
    from tests.metrics_fixtures import run_metrics, scored_set

    tail = None
    if auc is not None:
        tail = scored_set(auc, baseline=baseline, rows=rows, champion=champion[1] if champion is not None else None,
                          half_width=half_width)
    metrics = run_metrics(run_id, forward_tail=tail, champion_run_id=champion[0] if champion is not None else None,
                          snapshot_id=42, t_handoff=T_HANDOFF, handoff_offsets={"0": 1}, final_offsets={"0": 9},
                          samples_iceberg=10, samples_kafka=2)
    (run / "metrics.json").write_text(metrics.to_json())
    return run


def plan_for(settings: Any, request: Any, *, run_id: str, snapshot_id: int, cache_dir: str | None = None,
             t_handoff: datetime = T_HANDOFF, write: bool = True) -> Any:
    """A run plan as the render step writes it (its window ending at T), without a catalog: for
    tests of what a launch does with a plan. Written into the run folder unless `write` is false."""
    from slipstream.lake.planning import WindowFile, window_bounds
    from slipstream.pipeline.runlayout import run_dir
    from slipstream.pipeline.runplan import RunPlan, write_plan

    start, end = window_bounds(t_handoff, request.window_days)
    plan = RunPlan(run_id=run_id, table=settings.table, snapshot_id=snapshot_id, window_start=start, t_handoff=end,
                   topic=settings.topic, bootstrap=settings.kafka_bootstrap, max_lateness_s=120.0,
                   cache_dir=settings.cache_dir if cache_dir is None else cache_dir,
                   run_dir=str(run_dir(settings, run_id)),
                   files=(WindowFile("file:///warehouse/samples/data/part-0.parquet", 1000, 10),), request=request)
    if write:
        write_plan(plan)
    return plan


def airflow_cli_env(home: Path) -> dict[str, str]:
    """Environment of an Airflow CLI subprocess on a SQLite database under `home`."""
    from slipstream.dev.stack import airflow_env
    from slipstream.settings import Settings

    env = {**os.environ, **airflow_env(Settings(home=home))}
    env["SLIPSTREAM_HOME"] = str(home)
    return env


def airflow(args: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    return subprocess.run([str(bin_dir / "airflow"), *args], env=env, capture_output=True, text=True, timeout=timeout)


_MIGRATED: list[Path] = []


@pytest.fixture(scope="session")
def migrated_airflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Airflow SQLite database migrated once per session; tests copy it (`use_airflow_db`)
    instead of paying `airflow db migrate` each time. (Each test module that imports this fixture
    gets its own registration, hence the module-level cache.)"""
    if not _MIGRATED:
        home = tmp_path_factory.mktemp("airflow-db")
        out = airflow(["db", "migrate"], airflow_cli_env(home))
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        _MIGRATED.append(home / "airflow" / "airflow.db")
    return _MIGRATED[0]


def use_airflow_db(template: Path, home: Path) -> None:
    import shutil

    target = home / "airflow" / "airflow.db"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, target)


LOOPBACK_PREFIXES = ("127.", "::1", "::ffff:127.")


def _loopback(ip: str) -> bool:
    return ip.startswith(LOOPBACK_PREFIXES) or ip == "localhost"


class SocketWatch:
    """Every inet socket the process trees of `roots()` hold, sampled (psutil) in a thread until
    stopped: a listener or a connection off the loopback interface is what `off_loopback` lists."""

    def __init__(self, roots: Any, interval_s: float = 0.25) -> None:
        import threading

        self.roots, self.interval_s = roots, interval_s
        self.seen: dict[tuple[Any, ...], str] = {}
        self.pids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> SocketWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        import psutil

        for root in list(self.roots()):
            try:
                procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
            except psutil.Error:
                continue
            for proc in procs:
                try:
                    conns, name = proc.net_connections(kind="inet"), " ".join(proc.cmdline()[:4])[:160]
                except psutil.Error:
                    continue
                self.pids.add(proc.pid)
                for c in conns:
                    key = (proc.pid, c.type, c.status, c.laddr.ip if c.laddr else "", c.laddr.port if c.laddr else 0,
                           c.raddr.ip if c.raddr else "", c.raddr.port if c.raddr else 0)
                    self.seen.setdefault(key, name)

    def off_loopback(self) -> list[str]:
        """One line per socket with an end off 127.0.0.1/::1 (a listener on `::` or 0.0.0.0 included)."""
        out = []
        for (pid, _kind, status, lip, lport, rip, rport), name in sorted(self.seen.items()):
            if (lip and not _loopback(lip)) or (rip and not _loopback(rip)):
                out.append(f"pid {pid} ({name}): {status} {lip}:{lport} -> {rip}:{rport}")
        return out

    def listeners(self) -> list[tuple[str, int]]:
        return sorted({(k[3], k[4]) for k in self.seen if k[2] == "LISTEN"})
