"""Moving a warmup's files: worker threads, each with its own kept-alive connection, that keep
enough requests in flight to hide the store's round trip.

What a warmup asks of the store is a queue of requests: the ranges of each large file (largest
files first, so none starts last and runs alone), then files of their own, then the small files
in path order, which each thread packs into a block of its own (`pack.BlockWriter`). A thread
takes the next request when its last one is done.

How many threads (requests in flight) is `inflight.InFlight`'s business: a fixed number, or `auto`
(Little's law on the measured round trip and rate, then climbing while it pays).

Store errors (connection refused or reset, 5xx, 429) are retried with backoff for `retry_s` after
a file's first failure, long enough to outlast a store's restart; a missing object (404), a
refused request (403, 400, ...) or a copy that does not match its size or ETag fails at once. A
warmup being torn down (an exception or a signal in the calling thread) stops its retries and its
threads at their next request.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from queue import Empty, SimpleQueue
from typing import TypeVar

from slipstream.cache.copy import Placed, check_file, check_ranges, copy_atomic, verify_copy, writer_at
from slipstream.cache.index import CacheLayout
from slipstream.cache.inflight import InFlight, remember, remembered
from slipstream.cache.pack import Attempt, BlockWriter, SealedBlock, Sized, plan_packing
from slipstream.cache.s3get import RequestRefused, S3Getter, getter_for
from slipstream.cache.settings import WarmKnobs

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.25
BACKOFF_MAX_S = 8.0
T = TypeVar("T")


class Stopped(Exception):
    """The warmup is being torn down: a retry was abandoned."""


def with_retries(remote: str, fn: Callable[[], T], *, budget_s: float,
                 wait: Callable[[float], bool] | None = None, clock: Callable[[], float] = time.monotonic) -> T:
    """Run `fn`, retrying store errors (`OSError`, not a missing object) with exponential backoff
    for `budget_s` after the first failure. `wait(seconds)` sleeps between tries and returns True
    when the warmup is being torn down (`threading.Event.wait`), which abandons the retries."""
    deadline: float | None = None
    delay = BACKOFF_FIRST_S
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except (FileNotFoundError, RequestRefused):
            raise
        except OSError as e:
            now = clock()
            deadline = now + budget_s if deadline is None else deadline
            if now + delay > deadline:
                raise
            log.debug("copy of %s failed (attempt %d, %.0fs of %.0fs left): %s; retrying in %.2fs",
                      remote, attempt, deadline - now, budget_s, e, delay)
            if wait is None:
                time.sleep(delay)
            elif wait(delay):
                raise Stopped(f"warmup stopped while retrying {remote}") from e
            delay = min(delay * 2, BACKOFF_MAX_S)


class LargeCopy:
    """A file fetched as parallel ranged GETs written in place into one temporary file; the
    thread that finishes its last range verifies it and renames it into `files/`. Such objects
    are usually multipart uploads whose ETag cannot be checked without the part sizes: the size
    (from the table metadata, confirmed by each range's Content-Range) is the check; ranges from
    different versions of the object (their ETags differ) are refused."""

    def __init__(self, item: Sized, layout: CacheLayout, range_bytes: int, verify_etag: bool = True) -> None:
        assert item.size is not None
        self.verify_etag = verify_etag
        self.item = item
        self.size = item.size
        self.local = layout.local_path(item.remote)
        self.tmp = layout.tmp / f"w-{uuid.uuid4().hex}.part"
        self.offsets = list(range(0, self.size, range_bytes)) or [0]
        self.range_bytes = range_bytes
        self.lock = threading.Lock()
        self.fd = -1
        """Opened by the first range (a plan of many large files holds no descriptor for each)."""
        self.left = len(self.offsets)
        self.parts: list[tuple[int, int | None, str | None]] = []
        self.error: BaseException | None = None

    def fetch(self, offset: int, getter: S3Getter, attempt: Attempt) -> SealedBlock | None:
        """Fetch one range; returns the outcome when this was the file's last range."""
        part = None
        with self.lock:
            if self.fd < 0 and self.error is None:
                self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        if self.error is None:
            try:
                part = attempt(self.item.remote, lambda: self._get(offset, getter))
            except BaseException as e:  # noqa: BLE001 - the file fails, the others go on
                self.error = self.error or e
        with self.lock:
            if part is not None:
                self.parts.append(part)
            self.left -= 1
            if self.left:
                return None
        return self._finish()

    def _get(self, offset: int, getter: S3Getter) -> tuple[int, int | None, str | None]:
        write = writer_at(self.fd, offset)
        length = max(1, min(self.range_bytes, self.size - offset))
        return getter.get_range(self.item.remote[5:], offset, length, write)

    def abandon(self) -> None:
        """The warmup stopped before the file's last range: drop what was fetched."""
        with self.lock:
            if self.left and self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
                self.tmp.unlink(missing_ok=True)

    def _finish(self) -> SealedBlock:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            if self.error is not None:
                raise self.error
            size, etag = check_ranges(self.item.remote, self.parts, self.size)
            verify_copy(self.item.remote, size, self.size, etag, check_file(self.tmp, etag) if self.verify_etag else None)
            try:
                os.replace(self.tmp, self.local)
            except FileNotFoundError:
                self.local.parent.mkdir(parents=True, exist_ok=True)
                os.replace(self.tmp, self.local)
        except BaseException as e:  # noqa: BLE001 - reported with the file's name
            self.tmp.unlink(missing_ok=True)
            return SealedBlock(None, [], [(self.item.remote, e)])
        return SealedBlock(None, [Placed(self.item.remote, self.local, self.size, etag)], [])


Request = tuple[str, Sized | LargeCopy, int]
"""(kind, item or LargeCopy, range offset): kind is "range", "single" or "pack"."""


def plan_requests(items: Sequence[Sized], layout: CacheLayout, io_properties: dict[str, str], knobs: WarmKnobs
                  ) -> tuple[list[Request], list[LargeCopy]]:
    """The warmup's requests in the order they are served (see the module's doc)."""
    small, singles = plan_packing(items, knobs.pack_below_bytes)
    singles.sort(key=lambda i: -(i.size or 0))
    ranged = getter_for(io_properties) is not None
    requests: list[Request] = []
    large: list[LargeCopy] = []
    rest: list[Request] = []
    for item in singles:
        if ranged and item.remote.startswith("s3://") and item.size is not None and item.size > knobs.range_bytes:
            copy = LargeCopy(item, layout, knobs.range_bytes, knobs.verify == "etag")
            large.append(copy)
            requests += [("range", copy, off) for off in copy.offsets]
        else:
            rest.append(("single", item, 0))
    return [*requests, *rest, *(("pack", i, 0) for i in small)], large


class Transfer:
    """Runs a warmup's requests on a pool of threads whose size the calling thread adjusts
    (`control`); results arrive on `results` as `SealedBlock`s (a file of its own or a range
    file: `block` None)."""

    def __init__(self, layout: CacheLayout, io_properties: dict[str, str], knobs: WarmKnobs,
                 requests: list[Request], large: list[LargeCopy]) -> None:
        self.layout = layout
        self.io_properties = io_properties
        self.knobs = knobs
        self.getter = getter_for(io_properties)
        self.store = io_properties.get("s3.endpoint") or "default"
        self.results: SimpleQueue[SealedBlock] = SimpleQueue()
        self.stop = threading.Event()
        self.inflight = InFlight(knobs.concurrency, knobs.max_concurrency, remembered(layout.root, self.store))
        self.clock = self.inflight.clock
        self.threads: list[threading.Thread] = []
        self.requests = len(requests)
        self.large = large
        self._queue = deque(requests)
        """Taken with `popleft`, atomic in CPython: no lock for 200 threads to queue on."""

    @property
    def target(self) -> int:
        return self.inflight.target

    def attempt(self, remote: str, fn: Callable[[], T]) -> T:
        return with_retries(remote, fn, budget_s=self.knobs.retry_s, wait=self.stop.wait)

    def start(self) -> None:
        self._grow()

    def _grow(self) -> None:
        """A thread for every slot under the target (slot i exits when the target drops to i or
        below, after its current request; a slot whose thread exited is started again)."""
        for slot in range(min(self.target, self.requests)):
            if slot < len(self.threads) and self.threads[slot].is_alive():
                continue
            t = threading.Thread(target=self._work, args=(slot,), name=f"warm-{slot}", daemon=True)
            if slot < len(self.threads):
                self.threads[slot] = t
            else:
                self.threads.append(t)
            t.start()

    def control(self) -> None:
        """Called by the owning thread about every `inflight.CONTROL_S`: size the pool."""
        before = self.target
        if self.inflight.update(len(self._queue)) > before:
            self._grow()

    def finished(self) -> bool:
        """Whether the pool stopped (torn down, or a thread failed) and no thread is left."""
        return self.stop.is_set() and not any(t.is_alive() for t in self.threads)

    def close(self) -> None:
        """Stop the threads (after their current request) and wait for them."""
        self.stop.set()
        for t in self.threads:
            t.join()
        for copy in self.large:
            copy.abandon()
        if self.knobs.concurrency is None and self.clock.totals().done:
            remember(self.layout.root, self.store, self.inflight.knee)

    def _next(self) -> Request | None:
        try:
            return self._queue.popleft()
        except IndexError:
            return None

    def _work(self, slot: int) -> None:
        writer: BlockWriter | None = None
        tally = self.clock.tally()
        stop, inflight, monotonic = self.stop, self.inflight, time.monotonic  # the loop runs once per file
        try:
            while not stop.is_set() and slot < inflight.target and (request := self._next()) is not None:
                kind, item, offset = request
                t0 = monotonic()
                files = 1
                if kind == "range":
                    assert isinstance(item, LargeCopy), "plan_requests: a range request carries its LargeCopy"
                    assert self.getter is not None, "plan_requests makes range requests only for a ranged getter"
                    done = item.fetch(offset, self.getter, self.attempt)
                    nbytes = min(item.range_bytes, item.size - offset)
                    files = int(done is not None)
                    if done is not None:
                        self.results.put(done)
                else:
                    assert not isinstance(item, LargeCopy), "plan_requests: pack and single requests carry a file"
                    if kind == "pack":
                        writer = self._pack(writer, item)
                    else:
                        self.results.put(self._single(item))
                    nbytes = item.size or 0
                now = monotonic()
                tally.record(kind, now - t0, nbytes, files, now)
            if writer is not None:
                if self.stop.is_set():  # torn down: nobody would commit the block
                    writer.abort()
                else:
                    self.results.put(writer.seal())
        except BaseException as e:  # noqa: BLE001 - handed to the owning thread
            if writer is not None:
                writer.abort()
                self.results.put(SealedBlock(None, [], [(r, e) for r in writer.members]))
            else:
                self.results.put(SealedBlock(None, [], [("(warm worker)", e)]))
            self.stop.set()
        finally:
            if writer is not None:
                writer.release()

    def _pack(self, writer: BlockWriter | None, item: Sized) -> BlockWriter:
        buffer = None
        folder = item.remote.rpartition("/")[0]
        if writer is not None and not writer.accepts(folder):
            self.results.put(writer.seal())
            buffer = writer.buffer
            writer = None
        if writer is None:
            writer = BlockWriter(self.layout, self.io_properties, self.attempt, block_bytes=self.knobs.block_bytes,
                                 max_member=self.knobs.pack_below_bytes, buffer=buffer,
                                 verify_etag=self.knobs.verify == "etag")
        assert item.size is not None, "plan_packing packs only files of known size"
        writer.append(item.remote, item.size, folder)
        return writer

    def _single(self, item: Sized) -> SealedBlock:
        try:
            placed = self.attempt(item.remote, lambda: copy_atomic(
                item.remote, self.layout.local_path(item.remote), self.layout.tmp, self.io_properties, item.size,
                range_bytes=self.knobs.range_bytes, verify_etag=self.knobs.verify == "etag"))
        except Exception as e:  # noqa: BLE001 - reported with the file's name
            return SealedBlock(None, [], [(item.remote, e)])
        return SealedBlock(None, [placed], [])


def drain(transfer: Transfer, timeout_s: float) -> list[SealedBlock]:
    """The results that arrived within `timeout_s` (at least one, or none on a timeout)."""
    try:
        batch = [transfer.results.get(timeout=timeout_s)]
    except Empty:
        return []
    while not transfer.results.empty():
        batch.append(transfer.results.get_nowait())
    return batch

