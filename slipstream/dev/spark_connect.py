"""A warm Spark for short jobs: the Spark Connect server of the installed pyspark, on 127.0.0.1.

Every preprocessing run that starts its own Spark pays a JVM, a SparkContext and the first job's
class loading, code generation and Python worker imports: seconds to tens of seconds on a small
machine, per Airflow task. A Spark Connect server pays them once; the job then runs as a thin
client (`SLIPSTREAM_SPARK_REMOTE=sc://127.0.0.1:PORT`, which `slipstream stack up --spark-connect`
records in the settings file), and its mapInArrow tasks run in the server's Python workers,
which stay up between jobs.

The server is `org.apache.spark.sql.connect.service.SparkConnectServer` from the pyspark wheel
(its jars ship `spark-connect_2.13`), started with `spark-submit` in its own process group and
stopped by PID like the stack's other servers. Its gRPC port, its driver and its block manager
bind 127.0.0.1; the web UI is off. Its Python workers import Slipstream from this checkout
(PYTHONPATH), as a local-mode job's do.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from slipstream.dev.spark_cluster import HOST, free_port, spark_home
from slipstream.errors import StackError
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.processes import pid_alive, start_process, stop_process

log = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
READY_TIMEOUT_S = 180.0
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ConnectServer:
    pid: int
    url: str
    """`sc://127.0.0.1:PORT`, what SLIPSTREAM_SPARK_REMOTE takes."""
    log_path: Path


def server_argv(port: int, spark: SparkSettings) -> list[str]:
    """spark-submit of the server with the job's Spark settings (local mode, loopback only)."""
    conf = {**spark.spark_conf(), "spark.connect.grpc.binding.address": HOST, "spark.connect.grpc.binding.port": str(port),
            "spark.driver.host": HOST, "spark.driver.bindAddress": HOST, "spark.ui.enabled": "false"}
    argv = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--name", "slipstream-spark-connect",
            "--master", spark.master if spark.is_local else "local[*]"]
    for k, v in conf.items():
        argv += ["--conf", f"{k}={v}"]
    return argv


def _answers(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False


def start_connect_server(home: Path, spark: SparkSettings | None = None, port: int | None = None) -> ConnectServer:
    """Start the server and return once its gRPC port answers (a JVM start: ~10-60 s here)."""
    spark = spark or SparkSettings()
    port = port or free_port()
    log_path = home / "logs" / "spark-connect.log"
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": HOST, "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
    pid = start_process("spark-connect", server_argv(port, spark), log_path, env=env)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _answers(port):
        if not pid_alive(pid):
            raise StackError(f"the Spark Connect server exited at start; see {log_path}")
        if time.monotonic() > deadline:
            stop_process(pid)
            raise StackError(f"the Spark Connect server did not answer on {HOST}:{port} within {READY_TIMEOUT_S:.0f}s; "
                             f"see {log_path}")
        time.sleep(0.5)
    url = f"sc://{HOST}:{port}"
    log.info("Spark Connect server up at %s (pid %d)", url, pid)
    return ConnectServer(pid, url, log_path)
