"""A TCP relay on 127.0.0.1 that puts a round-trip time between a client and a server: the
stand-in for a remote object store's network in `bench warmup` (Linux netem is not available).

Each direction is a delay line: every chunk read from one side is written to the other `rtt/2`
after it arrived, in order, while later chunks keep arriving, so the relay adds latency but not a
throughput limit (it is not a sleep per request, which would serialise a connection's traffic).
A new connection's first request waits one extra RTT, the cost of a TCP handshake, so keeping
connections alive pays off here as it does against a real store. The relay runs as a process of
its own (on uvloop when it is installed) so that it never competes for the benchmark's GIL; it
exits when the process that started it is gone, and `LatencyRelay.stop` ends it by its PID.

    python bench/support/relay.py --target 127.0.0.1:8333 --rtt-ms 5 --port-file /tmp/relay.port
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from collections import deque
from pathlib import Path
from typing import cast

HOST = "127.0.0.1"
HIGH_WATER = 64 << 20
"""Bytes a direction may hold in its delay line before it stops reading its source."""
LOW_WATER = 16 << 20
SOCKET_BUFFER = 4 << 20
HORIZON_S = 0.0003
"""A chunk due this soon is written now (timers have millisecond resolution: no spinning)."""


class DelayLine:
    """One direction of a connection: chunks in, the same chunks out `delay_s` later, in order."""

    lead_s = 0.0
    """How late this loop's timers fire (`calibrate_lead_s`; negative: early): they are set that much early."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay_s: float, first_extra_s: float = 0.0) -> None:
        self.loop = loop
        self.delay_s = delay_s
        self.extra_s = first_extra_s
        """Added to the first chunk only (the handshake of a new connection)."""
        self.queue: deque[tuple[float, bytes | None]] = deque()
        """(due time, chunk); None closes the destination."""
        self.source: asyncio.Transport | None = None
        self.dest: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.last_due = 0.0
        self.pending = 0
        self.dest_full = False
        self.source_paused = False

    def push(self, chunk: bytes | None) -> None:
        if self.delay_s <= 0 and self.extra_s <= 0 and not self.queue and self.dest is not None:
            if chunk is None:
                self.dest.close()
            else:
                self.dest.write(chunk)
            return
        due = max(time.monotonic() + self.delay_s + self.extra_s, self.last_due)
        self.extra_s = 0.0
        self.last_due = due
        self.queue.append((due, chunk))
        self.pending += len(chunk) if chunk else 0
        self._throttle()
        if self.timer is None and self.dest is not None:
            self._arm(due)

    def connected(self, dest: asyncio.Transport) -> None:
        self.dest = dest
        if self.queue and self.timer is None:
            self._arm(self.queue[0][0])

    def flush(self) -> None:
        """Write every chunk that is due."""
        self.timer = None
        assert self.dest is not None
        horizon = time.monotonic() + HORIZON_S
        due: list[bytes] = []
        close = False
        while self.queue and self.queue[0][0] <= horizon:
            _, chunk = self.queue.popleft()
            if chunk is None:
                close = True
                self.queue.clear()
                break
            self.pending -= len(chunk)
            due.append(chunk)
        if due:
            self.dest.writelines(due)  # one system call for all that is due
        if close:
            self.dest.close()
        if self.queue:
            self._arm(self.queue[0][0])
        self._throttle()

    def _arm(self, due: float) -> None:
        self.timer = self.loop.call_later(max(0.0, due - time.monotonic() - self.lead_s), self.flush)

    def _throttle(self) -> None:
        """Stop reading the source while the line or the destination's buffer is full."""
        if self.source is None:
            return
        full = self.dest_full or self.pending > HIGH_WATER
        if full and not self.source_paused:
            self.source.pause_reading()
            self.source_paused = True
        elif self.source_paused and not self.dest_full and self.pending < LOW_WATER:
            self.source.resume_reading()
            self.source_paused = False

    def set_dest_full(self, full: bool) -> None:
        self.dest_full = full
        self._throttle()

    def abort(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue.clear()


def _tune(transport: asyncio.BaseTransport) -> None:
    """No Nagle delay (the relay decides when bytes leave); large socket buffers, so that a busy
    relay reads big chunks (fewer callbacks per byte) instead of many small ones."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)


class _Side(asyncio.Protocol):
    """One socket of a relayed connection: what it reads goes into `inbound`; when its own writes
    back up, `outbound` (the line that writes to it) stops reading that line's source."""

    def __init__(self, inbound: DelayLine, outbound: DelayLine) -> None:
        self.inbound = inbound
        self.outbound = outbound

    def data_received(self, data: bytes) -> None:
        self.inbound.push(data)

    def eof_received(self) -> bool:
        return False  # close this side; connection_lost passes the close on, in order

    def connection_lost(self, exc: Exception | None) -> None:
        self.inbound.push(None)

    def pause_writing(self) -> None:
        self.outbound.set_dest_full(True)

    def resume_writing(self) -> None:
        self.outbound.set_dest_full(False)


class _ClientSide(_Side):
    def __init__(self, target: tuple[str, int], rtt_s: float) -> None:
        loop = asyncio.get_running_loop()
        super().__init__(DelayLine(loop, rtt_s / 2, first_extra_s=rtt_s), DelayLine(loop, rtt_s / 2))
        self.target = target

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _tune(transport)
        self.transport = cast(asyncio.Transport, transport)  # a TCP connection's transport reads and writes
        self.inbound.source = self.transport
        self.outbound.connected(self.transport)
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            server, _ = await loop.create_connection(lambda: _Side(self.outbound, self.inbound), *self.target)
        except OSError:
            self.inbound.abort()
            self.transport.close()
            return
        _tune(server)
        self.outbound.source = server
        self.inbound.connected(server)


class _Stopwatch:
    """A destination that notes when each chunk is written (calibration)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.written: asyncio.Future[float] = loop.create_future()

    def writelines(self, chunks: list[bytes]) -> None:
        self.written.set_result(time.monotonic())


async def calibrate_lead_s(delay_s: float, samples: int = 12, rounds: int = 3) -> float:
    """How much early to set a delay line's timers on this loop so that chunks leave on time.
    Event loops round timeouts to milliseconds (uvloop fires a 2.5 ms timer anywhere from 1.5 to
    3.5 ms), so the delay line itself is timed on a stopwatch destination at start, for `delay_s`,
    each round correcting the lead by the median error of the last."""
    loop = asyncio.get_running_loop()
    lead = 0.0
    for _ in range(rounds):
        DelayLine.lead_s = lead
        errors = []
        for i in range(samples):
            await asyncio.sleep(0)
            time.sleep(0.00025 * (i % 4))  # chunks arrive at any phase of the loop's cached millisecond clock
            line, watch = DelayLine(loop, delay_s), _Stopwatch(loop)
            line.connected(watch)  # type: ignore[arg-type]  # a stopwatch takes writelines only (no close is pushed)
            pushed = time.monotonic()
            line.push(b"x")
            errors.append(await watch.written - pushed - delay_s)  # (no polling: it would wake the loop early)
        lead += sorted(errors)[len(errors) // 2]
    return lead


async def serve(target: tuple[str, int], rtt_ms: float, port: int, port_file: Path | None) -> None:
    loop = asyncio.get_running_loop()
    if rtt_ms > 0:
        DelayLine.lead_s = await calibrate_lead_s(rtt_ms / 2000)
    server = await loop.create_server(lambda: _ClientSide(target, rtt_ms / 1000), HOST, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"port": bound, "pid": os.getpid(), "rtt_ms": rtt_ms,
                                   "timer_lead_ms": round(DelayLine.lead_s * 1000, 3)}))
        os.replace(tmp, port_file)
    parent = os.getppid()
    async with server:
        while os.getppid() == parent:  # the benchmark that started it is gone (even SIGKILLed): exit
            await asyncio.sleep(0.5)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="relay", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="HOST:PORT of the server")
    p.add_argument("--rtt-ms", type=float, default=0.0)
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    p.add_argument("--port-file", type=Path, help="written with the bound port once listening")
    args = p.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    coro = serve((host, int(port)), args.rtt_ms, args.port, args.port_file)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


class LatencyRelay:
    """The relay as a child process: `start()` returns its port, `stop()` ends it."""

    def __init__(self, target: str, rtt_ms: float, workdir: Path) -> None:
        self.target = target
        self.rtt_ms = rtt_ms
        self.workdir = workdir
        self.pid: int | None = None
        self.port: int | None = None

    def start(self, timeout_s: float = 20.0) -> int:
        from slipstream.processes import start_process

        self.workdir.mkdir(parents=True, exist_ok=True)
        port_file = self.workdir / f"relay-{self.rtt_ms:g}ms.port"
        port_file.unlink(missing_ok=True)
        argv = [sys.executable, str(Path(__file__).resolve()), "--target", self.target,
                "--rtt-ms", str(self.rtt_ms), "--port-file", str(port_file)]
        self.pid = start_process(f"latency relay ({self.rtt_ms:g} ms)", argv, self.workdir / "relay.log")
        deadline = time.monotonic() + timeout_s
        while not port_file.exists():
            from slipstream.processes import pid_alive

            if not pid_alive(self.pid) or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the latency relay did not start; see {self.workdir / 'relay.log'}")
            time.sleep(0.02)
        self.port = int(json.loads(port_file.read_text())["port"])
        return self.port

    def stop(self) -> None:
        from slipstream.processes import stop_process

        if self.pid is not None:
            stop_process(self.pid, timeout_s=5.0)
            self.pid = None

    def __enter__(self) -> LatencyRelay:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    main()
