"""The latency relay's delay line (bench/support/relay.py) on an event loop, without sockets: every chunk
leaves after the delay, in order, while later chunks keep arriving (a delay line, not a sleep
per request), a close follows the data, and a full line stops reading its source."""

from __future__ import annotations

import asyncio
import time

from bench.support.relay import HIGH_WATER, HORIZON_S, DelayLine


class Sink:
    """A destination transport that notes what it got and when."""

    def __init__(self) -> None:
        self.got: list[tuple[float, bytes]] = []
        self.closed_at: float | None = None

    def writelines(self, chunks: list[bytes]) -> None:
        now = time.monotonic()
        self.got += [(now, c) for c in chunks]

    def close(self) -> None:
        self.closed_at = time.monotonic()


class Source:
    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def test_chunks_leave_after_the_delay_in_order_and_overlap() -> None:
    delay = 0.030

    async def run() -> tuple[list[tuple[float, bytes]], list[float], Sink]:
        line, sink = DelayLine(asyncio.get_running_loop(), delay), Sink()
        line.connected(sink)  # type: ignore[arg-type]
        pushed = []
        for i in range(20):  # one chunk every 2 ms: 40 ms of traffic through a 30 ms line
            pushed.append(time.monotonic())
            line.push(f"chunk-{i:02d}".encode())
            await asyncio.sleep(0.002)
        line.push(None)
        await asyncio.sleep(delay * 3)
        return sink.got, pushed, sink

    got, pushed, sink = asyncio.run(run())
    assert [c for _, c in got] == [f"chunk-{i:02d}".encode() for i in range(20)]
    for (at, _), sent in zip(got, pushed):
        assert at - sent >= delay - HORIZON_S - 0.002, "no chunk leaves early"
    assert got[0][0] < pushed[-1], "the first chunk left while later ones were still arriving"
    assert sink.closed_at is not None and sink.closed_at >= got[-1][0], "the close follows the data"


def test_a_full_line_stops_reading_its_source_until_it_drains() -> None:
    async def run() -> tuple[bool, bool]:
        line, sink, source = DelayLine(asyncio.get_running_loop(), 0.01), Sink(), Source()
        line.source = source  # type: ignore[assignment]
        line.connected(sink)  # type: ignore[arg-type]
        line.push(b"x" * (HIGH_WATER + 1))
        full = source.paused
        await asyncio.sleep(0.05)
        return full, source.paused

    full, after = asyncio.run(run())
    assert full and not after


def test_no_delay_writes_through() -> None:
    async def run() -> Sink:
        line, sink = DelayLine(asyncio.get_running_loop(), 0.0), Sink()
        line.connected(sink)  # type: ignore[arg-type]
        sink.writelines = None  # type: ignore[assignment]  # a direct write goes through .write
        sink.write = lambda chunk: sink.got.append((time.monotonic(), chunk))  # type: ignore[attr-defined]
        line.push(b"now")
        return sink

    assert [c for _, c in asyncio.run(run()).got] == [b"now"]
