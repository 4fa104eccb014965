"""Topics written by transactional producers that commit, abort and die, for the stream tests.

`write_transactions` writes committed and aborted transactions from one transactional id (what
the joiner's output looks like around a crash); `killed_mid_transaction` does it the way it
happens: a producer process is killed with SIGKILL inside an open transaction and its successor
(same transactional id) fences it, which aborts what it left open, then commits the rest. Both
return a `TxnLayout`: which offsets hold committed records, where the aborted ones and their
marker lie. The trainer's tests reuse them (resume right after an abort marker, a trainer tailing
a joiner that is killed mid-transaction).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from slipstream.stream.kafka import client_config, consumer_config, create_topic

REPO = Path(__file__).resolve().parents[1]


@dataclass
class TxnLayout:
    topic: str
    partition: int
    committed: list[int] = field(default_factory=list)
    """Offsets of committed records, rising."""
    values: dict[int, bytes] = field(default_factory=dict)
    """Committed offset -> value."""
    aborted: list[tuple[int, int]] = field(default_factory=list)
    """[first, marker] of each aborted transaction: its records and its abort marker."""
    end: int = 0
    """The high watermark once written."""

    def committed_in(self, start: int, stop: int) -> list[int]:
        return [o for o in self.committed if start <= o < stop]


def high_watermark(bootstrap: str, topic: str, partition: int) -> int:
    c = Consumer(consumer_config(bootstrap, group="fixture-watermarks"))
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)[1])
    finally:
        c.close()


def transactional_producer(bootstrap: str, txn_id: str) -> Producer:
    p = Producer(client_config(bootstrap, **{"transactional.id": txn_id, "linger.ms": 5}))
    p.init_transactions(30)
    return p


Value = bytes | tuple[bytes, int]
"""A record's value, or (value, timestamp in epoch ms)."""


def write_transactions(bootstrap: str, topic: str, plan: list[tuple[bool, list[Value]]], *, txn_id: str = "fixture",
                       partition: int = 0, layout: TxnLayout | None = None,
                       producer: Producer | None = None) -> TxnLayout:
    """Each (commit?, values) of `plan` as one transaction on `partition` (the topic is created
    with one partition when missing). Offsets are read back from the high watermark: one record
    per value, then the transaction's marker."""
    create_topic(bootstrap, topic, 1)
    layout = layout or TxnLayout(topic, partition)
    p = producer or transactional_producer(bootstrap, txn_id)
    for commit, values in plan:
        first = high_watermark(bootstrap, topic, partition)
        p.begin_transaction()
        for v in values:
            value, ts = v if isinstance(v, tuple) else (v, 0)
            p.produce(topic, value=value, key=b"k", partition=partition, timestamp=ts)
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)
        marker = first + len(values)
        if commit:
            layout.committed += list(range(first, marker))
            layout.values.update(zip(range(first, marker), (v[0] if isinstance(v, tuple) else v for v in values)))
        else:
            layout.aborted.append((first, marker))
    layout.end = high_watermark(bootstrap, topic, partition)
    return layout


_DYING_PRODUCER = """
import sys, time
from confluent_kafka import Producer
bootstrap, topic, txn_id, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
p.init_transactions(30)
p.begin_transaction()
for i in range(n):
    p.produce(topic, value=b"aborted-%d" % i, key=b"k", partition=0)
p.flush(30)
print("open", flush=True)
time.sleep(600)
"""


def killed_mid_transaction(bootstrap: str, topic: str, before: list[bytes], after: list[bytes], *, doomed: int = 10,
                           txn_id: str = "joiner-like", between: Callable[[str], None] | None = None) -> TxnLayout:
    """Committed `before` (one transaction), then a producer process with the same transactional
    id that writes `doomed` records in a transaction and is killed with SIGKILL before it
    commits; its successor fences it (the open transaction is aborted) and commits `after`.
    `between(stage)` is called after each stage ("committed", "killed", "fenced"), e.g. to let a
    tailing reader poll while the transaction is open and after it was aborted."""
    between = between or (lambda stage: None)
    layout = write_transactions(bootstrap, topic, [(True, before)], txn_id=txn_id)
    between("committed")
    first = layout.end
    proc = subprocess.Popen([sys.executable, "-c", _DYING_PRODUCER, bootstrap, topic, txn_id, str(doomed)],
                            stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == b"open", line
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    between("killed")
    successor = transactional_producer(bootstrap, txn_id)  # fences the dead one: its transaction is aborted
    deadline = time.monotonic() + 30
    while high_watermark(bootstrap, topic, 0) < first + doomed + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    marker = high_watermark(bootstrap, topic, 0) - 1
    layout.aborted.append((first, marker))
    between("fenced")
    return write_transactions(bootstrap, topic, [(True, after)], layout=layout, producer=successor)
