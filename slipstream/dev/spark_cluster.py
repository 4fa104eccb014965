"""A Spark standalone cluster on 127.0.0.1 from the installed pyspark distribution: one master and
N workers, each a JVM started with `bin/spark-class` in its own process group (stopped by PID
like the stack's other servers).

Every listener (master RPC and web UI, worker RPC and web UI, executors) binds 127.0.0.1
(`SPARK_LOCAL_IP` plus explicit `--host`). The workers start without the caller's PYTHONPATH, so
executors find Slipstream's code only in what the job ships (`--py-files`), as on a real cluster.
`start_cluster` returns once the master reports every worker ALIVE.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from slipstream.errors import StackError
from slipstream.processes import pid_alive, start_process, stop_process, usable_cpus

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
DAEMON_MEMORY = "256m"
"""Heap of the master and worker daemons themselves (Spark's default is 1g each)."""
READY_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class WorkerShape:
    cores: int = 1
    memory: str = "1g"
    """What a worker offers to executors (one executor per worker with the defaults)."""
    own_cpu: bool = False
    """Confine worker i, its executors and their Python workers to CPU i (round robin over the
    CPUs this process may use), as if each worker were a machine of its own. Without it an
    executor of one Spark core uses more than one CPU (the JVM's task thread and the Python
    worker it feeds run at once), so "one worker vs two" on one machine would compare the same
    CPUs twice (docs/cluster.md)."""


def spark_home() -> Path:
    """The Spark distribution inside the pyspark wheel (bin/spark-class, jars/)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("pyspark is not installed: run `make venv` (it is pinned in requirements.txt)")
    home = Path(list(spec.submodule_search_locations)[0])
    if not (home / "bin" / "spark-class").exists():
        raise StackError(f"{home} has no bin/spark-class: the pyspark install is incomplete, reinstall it")
    return home


def daemon_env(home: Path) -> dict[str, str]:
    """Environment of the master and worker JVMs: loopback only, logs and work under <home>/spark,
    no PYTHONPATH (executors must get the code from the job, not from this checkout)."""
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {
        **base,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": HOST,
        "SPARK_LOG_DIR": str(home / "spark" / "logs"),
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_NO_DAEMONIZE": "1",
        # the REST submission server takes a fixed port (6066) that two stacks would fight over
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
    }


def _spark_class(*args: str) -> list[str]:
    return [str(spark_home() / "bin" / "spark-class"), *args]


def master_argv(port: int, ui_port: int) -> list[str]:
    return _spark_class("org.apache.spark.deploy.master.Master", "--host", HOST, "--port", str(port),
                        "--webui-port", str(ui_port))


def worker_argv(master_url: str, ui_port: int, work_dir: Path, shape: WorkerShape) -> list[str]:
    return _spark_class("org.apache.spark.deploy.worker.Worker", master_url, "--host", HOST,
                        "--cores", str(shape.cores), "--memory", shape.memory,
                        "--webui-port", str(ui_port), "--work-dir", str(work_dir))


def alive_workers(ui_url: str) -> int:
    """How many workers the master's web UI reports ALIVE (0 while it is not answering)."""
    try:
        with urllib.request.urlopen(f"{ui_url}/json/", timeout=2) as resp:
            info = json.loads(resp.read())
    except (OSError, ValueError):
        return 0
    return sum(1 for w in info.get("workers", []) if w.get("state") == "ALIVE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class SparkCluster:
    master_url: str
    ui_url: str
    master_pid: int
    worker_pids: list[int]
    worker_uis: list[str]


def start_cluster(home: Path, workers: int, shape: WorkerShape = WorkerShape()) -> SparkCluster:
    """A master and `workers` workers on 127.0.0.1; stops what it started if they do not come up."""
    if workers < 1:
        raise StackError(f"--spark-workers must be >= 1, got {workers}")
    env = daemon_env(home)
    logs = home / "logs"
    port, ui_port = free_port(), free_port()
    master_url, ui_url = f"spark://{HOST}:{port}", f"http://{HOST}:{ui_port}"
    pids: list[int] = []
    uis: list[str] = []
    cpus = usable_cpus()
    try:
        pids.append(start_process("spark-master", master_argv(port, ui_port), logs / "spark-master.log", env))
        for i in range(workers):
            work = home / "spark" / f"work-{i}"
            work.mkdir(parents=True, exist_ok=True)
            port_i = free_port()
            uis.append(f"http://{HOST}:{port_i}")
            pids.append(start_process(f"spark-worker-{i}", worker_argv(master_url, port_i, work, shape),
                                      logs / f"spark-worker-{i}.log", env,
                                      cpus=[cpus[i % len(cpus)]] if shape.own_cpu else None))
        _wait_ready(ui_url, workers, pids, logs)
    except BaseException:
        for pid in reversed(pids):
            stop_process(pid)
        raise
    log.info("spark cluster %s: %d worker(s) x %d core(s), %s%s", master_url, workers, shape.cores, shape.memory,
             ", a CPU each" if shape.own_cpu else "")
    return SparkCluster(master_url, ui_url, pids[0], pids[1:], uis)


def _wait_ready(ui_url: str, workers: int, pids: list[int], logs: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while alive_workers(ui_url) < workers:
        dead = [p for p in pids if not pid_alive(p)]
        if dead:
            raise StackError(f"a Spark daemon (pid {dead[0]}) exited at start; see {logs}/spark-*.log "
                             "(is Java 17 on PATH?)")
        if time.monotonic() > deadline:
            raise StackError(f"the Spark master at {ui_url} did not see {workers} live worker(s) within "
                             f"{READY_TIMEOUT_S:.0f}s; see {logs}/spark-*.log")
        time.sleep(0.5)
