"""Writers into the local stack's broker, and a broker shutdown that loses none of their records.

The embedded broker (noida-db) keeps acknowledging writes for seconds after SIGTERM and loses
some of the records it acknowledged then (and, on kill -9, its last second or so of writes). So
`slipstream stack down` stops whatever writes first: the joiner (SIGTERM: it commits its open
transaction and leaves its group), then every command that produces into this home's broker
(`slipstream generate`, `import`, the demo's raw stream: each registers itself for as long as it
produces, `registered_producer`), waits for them to exit (they flush what they produced), then
waits until the broker's logs stop growing for `QUIET_S` (it has written what it acknowledged),
and only then stops the broker.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slipstream.processes import pid_alive, signal_quietly

log = logging.getLogger(__name__)

PRODUCERS_DIR = "producers"
QUIET_S = 1.5
"""How long the broker's high watermarks must stand still before it is stopped: noida-db writes
what it acknowledged to its data dir within about a second (measured: a kill -9 one second after
the last acknowledgement kept every record, right after it lost them)."""
QUIET_TIMEOUT_S = 30.0
PRODUCER_GRACE_S = 30.0


@contextmanager
def registered_producer(home: Path, name: str) -> Iterator[None]:
    """While the block runs, `stack down` of `home` stops this process (SIGTERM) and waits for it
    to exit before it stops the broker. Use it around a command's produce loop."""
    folder = home / PRODUCERS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    entry = folder / f"{os.getpid()}.json"
    entry.write_text(json.dumps({"pid": os.getpid(), "name": name, "started": time.time()}))
    try:
        yield
    finally:
        entry.unlink(missing_ok=True)


def running_producers(home: Path) -> list[tuple[int, str]]:
    """(pid, name) of the registered producers of `home` still running (stale entries removed)."""
    out = []
    for entry in sorted((home / PRODUCERS_DIR).glob("*.json")):
        try:
            info = json.loads(entry.read_text())
            pid, name = int(info["pid"]), str(info["name"])
        except (OSError, ValueError, KeyError):
            continue
        if pid_alive(pid):
            out.append((pid, name))
        else:
            entry.unlink(missing_ok=True)
    return out


def stop_producers(home: Path, grace_s: float = PRODUCER_GRACE_S) -> list[str]:
    """SIGTERM every registered producer of `home` but this process, and wait for them to exit
    (they flush first); one still running after `grace_s` is killed (what it had not flushed was
    never acknowledged). Returns "name (pid N)" of each."""
    producers = [(pid, name) for pid, name in running_producers(home) if pid != os.getpid()]
    for pid, name in producers:
        log.info("stopping producer %s (pid %d) before the broker", name, pid)
        signal_quietly(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for pid, name in producers:
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            log.warning("producer %s (pid %d) did not exit within %.0fs of SIGTERM: killing it", name, pid, grace_s)
            signal_quietly(pid, signal.SIGKILL)
    return [f"producer {name} (pid {pid})" for pid, name in producers]


def wait_until_quiet(bootstrap: str, quiet_s: float = QUIET_S, timeout_s: float = QUIET_TIMEOUT_S) -> bool:
    """Wait until no partition of the broker grows for `quiet_s`; False (with a warning naming the
    topics still written) at the timeout: a producer the stack did not start is still writing,
    and what the broker acknowledges to it during its shutdown may be lost."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]  # confluent_kafka.admin re-exports it without __all__

    from slipstream.stream.kafka import client_config

    admin = AdminClient(client_config(bootstrap))

    def ends() -> dict[tuple[str, int], int]:
        topics = admin.list_topics(timeout=5).topics
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]  # confluent_kafka leaves OffsetSpec.earliest/latest unannotated
        asked = {TopicPartition(t, p): latest for t, md in topics.items() for p in md.partitions}
        if not asked:
            return {}
        futures = admin.list_offsets(asked, request_timeout=5)
        return {(tp.topic, tp.partition): int(f.result(timeout=5).offset) for tp, f in futures.items()}

    deadline = time.monotonic() + timeout_s
    try:
        last, since = ends(), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = ends()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return True
    except KafkaException as e:
        log.warning("could not watch the broker at %s go quiet (%s): stopping it anyway", bootstrap, e)
        return False
    growing = sorted({t for (t, p), o in ends().items() if o != last.get((t, p))})
    log.warning("the broker at %s still receives writes after %.0fs (topics %s) from a producer the stack did not "
                "start: records it acknowledges during its shutdown may be lost", bootstrap, timeout_s, growing)
    return False
