"""The benchmarks' remote store: a SeaweedFS S3 server on 127.0.0.1 and, in front of it, latency
relays (`bench/support/relay.py`) that make it look as far away as an in-region or cross-region store.

Everything a benchmark starts here is stopped when it ends: normally, on an exception, and on
SIGTERM or SIGINT (`stop_on_signals` turns them into exceptions, so `finally` blocks run; the
default SIGTERM would end the process with its S3 server still listening).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import TypeVar

import psutil

from bench.support.relay import LatencyRelay
from slipstream.dev.s3server import S3Endpoint, S3Server

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


class Terminated(SystemExit):
    """SIGTERM arrived: unwind (stopping servers) and exit with 128 + 15."""


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the main thread (SIGINT already raises KeyboardInterrupt),
    so every `finally` on the way out runs; the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class RemoteStore:
    """An S3 server plus one relay per RTT; `endpoint(rtt_ms)` gives the endpoint seen through
    the relay of that RTT (0: the server directly). Use as a context manager."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.server = S3Server(workdir / "s3home")
        self.direct: S3Endpoint | None = None
        self.relays: dict[float, LatencyRelay] = {}
        self._stack = ExitStack()

    def __enter__(self) -> RemoteStore:
        self._stack.callback(self.server.stop)
        self.direct = self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def endpoint(self, rtt_ms: float, *, relay_when_zero: bool = False) -> S3Endpoint:
        """The store as seen across `rtt_ms` of round trip (a relay with no delay when
        `relay_when_zero`, to measure the relay's own cost)."""
        assert self.direct is not None, "use RemoteStore as a context manager"
        if rtt_ms <= 0 and not relay_when_zero:
            return self.direct
        relay = self.relays.get(rtt_ms)
        if relay is None:
            relay = LatencyRelay(self.direct.url.split("://", 1)[1], rtt_ms, self.workdir / "relay")
            self._stack.callback(relay.stop)
            relay.start()
            self.relays[rtt_ms] = relay
        return S3Endpoint(f"http://127.0.0.1:{relay.port}", self.direct.access_key, self.direct.secret_key,
                          self.direct.bucket, self.direct.region)

    def relay_cpu_s(self, rtt_ms: float) -> float:
        """CPU seconds the relay of `rtt_ms` has used so far (0 when there is none)."""
        relay = self.relays.get(rtt_ms)
        if relay is None or relay.pid is None:
            return 0.0
        times = psutil.Process(relay.pid).cpu_times()
        return float(times.user + times.system)

    def pids(self) -> list[int]:
        """Processes this store started (for the test that they all end)."""
        pid = self.server.status().get("pid")
        return ([int(pid)] if pid else []) + [r.pid for r in self.relays.values() if r.pid is not None]


def run_threads(fn: Callable[[T], int], items: Sequence[T] | Iterable[T], threads: int) -> int:
    """`sum(fn(x) for x in items)` on `threads` threads that each take the next item when done
    (no future per item: the raw baselines stay as lean as the warmup's own threads). An
    exception in any thread, or in the calling one (a signal), stops the others at their next item."""
    it = iter(items)
    lock = threading.Lock()
    stop = threading.Event()
    totals: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        total = 0
        try:
            while not stop.is_set():
                with lock:
                    item = next(it, None)
                if item is None:
                    break
                total += fn(item)
        except BaseException as e:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(e)
            stop.set()
        totals.append(total)

    pool = [threading.Thread(target=work, daemon=True) for _ in range(max(1, threads))]
    try:
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        stop.set()
        for t in pool:
            if t.ident is not None:
                t.join()
    if errors:
        raise errors[0]
    return sum(totals)
