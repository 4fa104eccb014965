"""The embedded local stack: a Kafka-protocol broker, the SQLite Iceberg catalog and AIRFLOW_HOME.

Everything binds 127.0.0.1 and lives under SLIPSTREAM_HOME. `up` records what it started (PID,
port) in `<home>/stack.json`; `down` stops exactly those processes, by PID.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slipstream.errors import ConfigError, StackError
from slipstream.processes import pid_alive, start_process, stop_process
from slipstream.settings import Settings, remove_settings_file, write_settings_file

if TYPE_CHECKING:
    from slipstream.dev.s3server import S3Endpoint

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
SPARK_EXECUTOR_MEMORY = "512m"  # per executor of the local Spark cluster (one per 1g worker)
SQLITE_BUSY_TIMEOUT_S = 60  # how long an Airflow process waits for the metadata database's write lock
PROFILES = ("local", "cluster")
CLUSTER_SPARK_WORKERS = 2
TABLE_BUCKET = "lake"
"""The cluster profile's S3 Tables bucket: the REST catalog's warehouse."""


@dataclass
class ServiceState:
    name: str
    pid: int
    address: str
    log: str


@dataclass
class StackState:
    services: dict[str, ServiceState] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    """Services the current `up` call started (not saved): what a failure of the caller stops."""

    @classmethod
    def load(cls, home: Path) -> StackState:
        path = home / "stack.json"
        if not path.exists():
            return cls()
        raw = json.loads(path.read_text())
        return cls({k: ServiceState(**v) for k, v in raw.get("services", {}).items()}, raw.get("env", {}))

    def save(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        tmp = home / "stack.json.tmp"
        tmp.write_text(json.dumps({"services": {k: asdict(v) for k, v in self.services.items()}, "env": self.env}, indent=2))
        tmp.replace(home / "stack.json")


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise StackError(f"{name} is not installed: run `make venv` (it is pinned in requirements.txt)")
    return found


def broker_argv(port: int, data_dir: Path) -> list[str]:
    """The command line of a noida-db Kafka broker on 127.0.0.1:port.

    It names the broker binary inside the wheel rather than the `noida-db` console script: the
    script is a Python launcher that runs the binary as its child, so its PID would be the
    launcher's, which exits on SIGTERM while the broker still holds the port."""
    from importlib.resources import files

    binary = Path(str(files("noida_db").joinpath("noida-db")))
    if not binary.is_file():
        raise StackError(f"the noida-db broker binary is missing at {binary}: run `make venv`")
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)
    return [str(binary), "start", "--only", "kafka", "--kafka-port", str(port), "--host", "127.0.0.1",
            "--data-dir", str(data_dir)]


def start_kafka(home: Path, port: int) -> ServiceState:
    """noida-db with only its Kafka service, on 127.0.0.1:port, data under <home>/kafka."""
    if port_open("127.0.0.1", port):
        raise StackError(
            f"port {port} on 127.0.0.1 is already in use: stop what holds it or set SLIPSTREAM_KAFKA_PORT"
        )
    data = home / "kafka"
    data.mkdir(parents=True, exist_ok=True)
    pid = start_process("kafka", broker_argv(port, data), home / "logs" / "kafka.log")
    try:
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", port):
            if not pid_alive(pid):
                raise StackError(f"the Kafka broker exited at start; see {home / 'logs' / 'kafka.log'}")
            if time.monotonic() > deadline:
                raise StackError(f"the Kafka broker did not listen on 127.0.0.1:{port} within 30s")
            time.sleep(0.1)
        from slipstream.stream.kafka import wait_for_broker

        wait_for_broker(f"127.0.0.1:{port}")
    except BaseException:  # not ready, Ctrl-C or SIGTERM: nobody else knows its PID yet
        stop_process(pid)
        raise
    return ServiceState("kafka", pid, f"127.0.0.1:{port}", str(home / "logs" / "kafka.log"))


def airflow_env(settings: Settings) -> dict[str, str]:
    """Environment for every Airflow process of the embedded stack (SQLite metadata)."""
    ah = settings.home / "airflow"
    return {
        "AIRFLOW_HOME": str(ah),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # the scheduler, dag-processor, api-server, task processes and CLI commands such as
        # `airflow backfill create` all write this one file: wait for the write lock instead of
        # failing with "database is locked" (sqlite3's default wait is 5 s)
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{ah / 'airflow.db'}?timeout={SQLITE_BUSY_TIMEOUT_S}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(ah / "logs"),
        "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "120",
        "PYTHONPATH": os.pathsep.join(
            [str(REPO_ROOT), str(REPO_ROOT / "plugins"), os.environ.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep),
        **settings.as_env(),
    }


def prepare_airflow(settings: Settings) -> None:
    """Create or migrate the Airflow metadata database (idempotent)."""
    env = {**os.environ, **airflow_env(settings)}
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    out = subprocess.run([_bin("airflow"), "db", "migrate"], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise StackError(f"`airflow db migrate` failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def prepare_catalog(settings: Settings) -> str:
    from slipstream.lake.iceberg import get_catalog, samples_table
    from slipstream.samples.spec import load_spec

    table = samples_table(get_catalog(settings), settings.namespace, load_spec(settings.spec))
    return ".".join(table.name())


S3_MODES = ("auto", "on", "off")


def s3_mode() -> str:
    """SLIPSTREAM_S3: whether `stack up` starts the local S3 server: `auto` (default: only when the
    warehouse is on s3://, so a local-disk stack stays fast), `on` (always), `off` (never)."""
    mode = os.environ.get("SLIPSTREAM_S3", "").strip().lower() or "auto"
    if mode not in S3_MODES:
        raise ConfigError(f"SLIPSTREAM_S3 must be one of {', '.join(S3_MODES)}, got {mode!r}")
    return mode


def start_s3_if_wanted(settings: Settings, state: StackState, *, force: bool = False,
                       table_bucket: str = "") -> ServiceState | None:
    """The local S3 server (SeaweedFS) when SLIPSTREAM_S3 is `on`, or `auto` (the default) and the
    warehouse is on s3://; keys from SLIPSTREAM_S3_ACCESS_KEY_ID/_SECRET_ACCESS_KEY, else generated
    once and kept (0600) under <home>/s3. Port: SLIPSTREAM_S3_PORT, else a free one, reused."""
    from slipstream.dev.s3server import S3Server
    from slipstream.lake.iceberg import warehouse_on_s3

    mode = s3_mode()
    if not force and (mode == "off" or (mode == "auto" and not warehouse_on_s3(settings))):
        return None
    raw_port = os.environ.get("SLIPSTREAM_S3_PORT", "")
    if raw_port and not raw_port.isdigit():
        raise StackError(f"SLIPSTREAM_S3_PORT must be a TCP port, got {raw_port!r}")
    server = S3Server(
        settings.home, int(raw_port) if raw_port else None,
        access_key=os.environ.get("SLIPSTREAM_S3_ACCESS_KEY_ID") or None,
        secret_key=os.environ.get("SLIPSTREAM_S3_SECRET_ACCESS_KEY") or None, table_bucket=table_bucket,
    )
    endpoint = server.start()
    pid = int(server.status()["pid"])
    return ServiceState("s3", pid, endpoint.url, str(server.log_path))


def up(settings: Settings, *, airflow: bool = True, spark_workers: int = 0, profile: str = "local",
       joiner: bool = False, spark_connect: bool = False) -> StackState:
    """Start what is not running yet and prepare the catalog (and AIRFLOW_HOME); with
    `spark_workers`, also a Spark standalone master and that many workers; with `joiner`, also the
    sample joiner (raw impressions + clicks -> the sample topic); with `spark_connect`, a warm Spark
    Connect server that preprocessing runs submit to (`slipstream.dev.spark_connect`). The `cluster` profile
    is the production-like one: S3 (SeaweedFS), its Iceberg REST catalog over the S3 warehouse,
    a Spark cluster (2 workers unless `spark_workers` says otherwise) and the broker. When any step
    fails or the command is interrupted, the servers this call started are stopped again (those
    that were already running are left alone); `state.started` names them on success."""
    state = StackState.load(settings.home)
    try:
        if profile not in PROFILES:
            raise ConfigError(f"stack profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        _up(settings, state, airflow, spark_workers or (CLUSTER_SPARK_WORKERS if profile == "cluster" else 0),
            profile == "cluster", spark_connect)
        if joiner:
            running = state.services.get("joiner")
            if running and pid_alive(running.pid):
                log.info("joiner already running (pid %d)", running.pid)
            else:
                state.services["joiner"] = start_joiner(settings)
                state.started.append("joiner")
                state.save(settings.home)
    except BaseException:
        stop_started(settings.home, state)
        raise
    return state


def stop_started(home: Path, state: StackState) -> None:
    """Stop the services `up` started in this call and forget them (a failed or interrupted start)."""
    for name in reversed(state.started):
        svc = state.services.pop(name, None)
        if svc is not None:
            log.warning("stopping %s (pid %d): the start did not complete", name, svc.pid)
            stop_process(svc.pid)
    state.started.clear()
    if not any(pid_alive(s.pid) for s in state.services.values()):
        state.env.clear()
        remove_settings_file(home)
    state.save(home)


def start_spark_if_wanted(home: Path, state: StackState, workers: int) -> None:
    """A Spark master + `workers` workers (once; a running master is kept), recorded as services;
    the preprocess launcher finds the master through SLIPSTREAM_SPARK_MASTER in the settings file."""
    if not workers:
        return
    master = state.services.get("spark-master")
    if master and pid_alive(master.pid):
        log.info("spark master already running (pid %d) at %s", master.pid, master.address)
    else:
        from slipstream.dev.spark_cluster import start_cluster

        cluster = start_cluster(home, workers)
        state.services["spark-master"] = ServiceState("spark-master", cluster.master_pid, cluster.master_url,
                                                      str(home / "logs" / "spark-master.log"))
        state.started.append("spark-master")
        for i, (pid, ui) in enumerate(zip(cluster.worker_pids, cluster.worker_uis)):
            name = f"spark-worker-{i}"
            state.services[name] = ServiceState(name, pid, ui, str(home / "logs" / f"{name}.log"))
            state.started.append(name)
        state.save(home)
    state.env["SLIPSTREAM_SPARK_MASTER"] = state.services["spark-master"].address
    state.env["SLIPSTREAM_SPARK_EXECUTOR_MEMORY"] = SPARK_EXECUTOR_MEMORY


def start_connect_if_wanted(home: Path, state: StackState) -> None:
    """The Spark Connect server (once; a running one is kept), recorded as a service; the
    preprocess launcher finds it through SLIPSTREAM_SPARK_REMOTE in the settings file."""
    running = state.services.get("spark-connect")
    if running and pid_alive(running.pid):
        log.info("spark connect server already running (pid %d) at %s", running.pid, running.address)
    else:
        from slipstream.dev.spark_connect import start_connect_server

        server = start_connect_server(home)
        state.services["spark-connect"] = ServiceState("spark-connect", server.pid, server.url, str(server.log_path))
        state.started.append("spark-connect")
    state.env["SLIPSTREAM_SPARK_REMOTE"] = state.services["spark-connect"].address
    state.save(home)


JOINER_IDLE_FLUSH_S = 5
"""The local stack replays generated events: once the input is read and quiet this long, the
joiner closes every window (a live deployment leaves this off)."""


def start_joiner(settings: Settings) -> ServiceState:
    """`slipstream joiner run` for the settings' spec, its health on a free 127.0.0.1 port; waits
    until it answers there (after the settings file names the broker)."""
    import urllib.request

    port = free_port()
    argv = [sys.executable, "-m", "slipstream.cli", "joiner", "run", "--spec", settings.spec, "--instance", "local",
            "--idle-flush-s", str(JOINER_IDLE_FLUSH_S), "--health-port", str(port)]
    log_path = settings.home / "logs" / "joiner.log"
    env = {**os.environ, "SLIPSTREAM_HOME": str(settings.home)}
    pid = start_process("joiner", argv, log_path, env=env)
    url = f"http://127.0.0.1:{port}/health"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                break
        except OSError:
            if not pid_alive(pid):
                raise StackError(f"the joiner exited at start; see {log_path}") from None
            if time.monotonic() > deadline:
                stop_process(pid)
                raise StackError(f"the joiner did not answer on {url} within 60s; see {log_path}") from None
            time.sleep(0.2)
    return ServiceState("joiner", pid, url, str(log_path))


def _up(settings: Settings, state: StackState, airflow: bool, spark_workers: int, cluster: bool,
        spark_connect: bool = False) -> None:
    home = settings.home
    home.mkdir(parents=True, exist_ok=True)
    kafka = state.services.get("kafka")
    if kafka and pid_alive(kafka.pid):
        log.info("kafka already running (pid %d) at %s", kafka.pid, kafka.address)
    else:
        state.services["kafka"] = start_kafka(home, settings.kafka_port)
        state.started.append("kafka")
        state.save(home)
    running_s3 = state.services.get("s3")
    s3 = start_s3_if_wanted(settings, state, force=cluster, table_bucket=TABLE_BUCKET if cluster else "")
    if s3 is not None:
        state.services["s3"] = s3
        if running_s3 is None or running_s3.pid != s3.pid:
            state.started.append("s3")
        state.save(home)
    start_spark_if_wanted(home, state, spark_workers)
    if spark_connect:
        start_connect_if_wanted(home, state)
    from slipstream.pipeline.datasets import deployment_datasets
    from slipstream.stream.kafka import create_topic

    bootstrap = state.services["kafka"].address
    for data in deployment_datasets(settings):  # each data set's sample and dead-letter topics
        create_topic(bootstrap, data.topic, data.topic_partitions)
        create_topic(bootstrap, data.dlq_topic, 1)
    state.env["SLIPSTREAM_KAFKA_BOOTSTRAP"] = bootstrap
    # every later command and child process of this home finds these servers through the settings
    # file (0600; the environment still wins), never through this module; stack.json keeps no key
    endpoint_env: dict[str, str] = {}
    if "s3" in state.services:
        from slipstream.dev.s3server import S3Server

        endpoint = S3Server(home).last_endpoint()
        endpoint_env = endpoint.env() if endpoint else {}
        state.env["SLIPSTREAM_S3_ENDPOINT"] = endpoint_env.get("SLIPSTREAM_S3_ENDPOINT", "")
        if cluster and endpoint is not None:
            endpoint_env.update(rest_catalog_env(endpoint))
    write_settings_file(home, {**endpoint_env, **state.env})
    state.save(home)
    prepare_catalog(with_stack_env(settings, endpoint_env))
    if airflow:
        prepare_airflow(settings)
    state.save(home)


def rest_catalog_env(endpoint: S3Endpoint) -> dict[str, str]:
    """The settings that make SeaweedFS's Iceberg REST catalog the catalog, over its table bucket
    (authenticated with the S3 keys as OAuth2 client credentials)."""
    return {
        "SLIPSTREAM_CATALOG": "rest",
        "SLIPSTREAM_CATALOG_URI": endpoint.iceberg_rest_url,
        "SLIPSTREAM_CATALOG_CREDENTIAL": f"{endpoint.access_key}:{endpoint.secret_key}",
        "SLIPSTREAM_WAREHOUSE": f"s3://{TABLE_BUCKET}/",
    }


def with_stack_env(settings: Settings, values: dict[str, str]) -> Settings:
    """`settings` with what `up` wrote to the settings file: the endpoints fill fields left unset,
    a profile's catalog replaces the local one."""
    given = {k.removeprefix("SLIPSTREAM_").lower(): v for k, v in values.items()}
    forced = {"catalog", "catalog_uri", "catalog_credential", "warehouse"} if "catalog_uri" in given else set()
    # the file's values are text: they fill text fields only (a number or a path keeps its parsed value)
    fill: dict[str, Any] = {k: v for k, v in given.items()
                            if isinstance(getattr(settings, k), str) and (k in forced or not getattr(settings, k))}
    return dataclasses.replace(settings, **fill)


def effective_settings(settings: Settings) -> Settings:
    """`settings` as the servers of its home's running stack make them (what a later command reads)."""
    from slipstream.settings import read_settings_file

    return with_stack_env(settings, {k: v for k, v in read_settings_file(settings.home).items()
                                     if k.removeprefix("SLIPSTREAM_").lower() in {f.name for f in dataclasses.fields(Settings)}})


WRITERS = ("joiner",)
"""Services that write to the broker: stopped before it (the joiner commits on SIGTERM)."""
WRITER_GRACE_S = 60.0


def down(settings: Settings) -> list[str]:
    """Stop what `up` started, by PID, writers first: the joiner (it commits its open
    transaction), then this home's registered producers (`slipstream.dev.producers`), then, once
    the broker has been quiet for a moment (it has written what it acknowledged), the broker and
    the rest. Returns "name (pid N)" of each process stopped, in order."""
    from slipstream.dev.producers import stop_producers, wait_until_quiet

    state = StackState.load(settings.home)
    stopped = []
    for name in [n for n in state.services if n in WRITERS]:
        svc = state.services.pop(name)
        stop_process(svc.pid, timeout_s=WRITER_GRACE_S)
        stopped.append(f"{name} (pid {svc.pid})")
        state.save(settings.home)
    stopped += stop_producers(settings.home)
    kafka = state.services.get("kafka")
    if kafka is not None and pid_alive(kafka.pid):
        wait_until_quiet(kafka.address)
    for name, svc in reversed(list(state.services.items())):
        stop_process(svc.pid)
        stopped.append(f"{name} (pid {svc.pid})")
        del state.services[name]
    state.env.clear()
    state.save(settings.home)
    remove_settings_file(settings.home)
    return stopped


def status(settings: Settings) -> dict[str, dict[str, object]]:
    state = StackState.load(settings.home)
    return {
        name: {"pid": svc.pid, "address": svc.address, "running": pid_alive(svc.pid), "log": svc.log}
        for name, svc in state.services.items()
    }
