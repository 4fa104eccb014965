"""`slipstream bench committed_reader --json`: what reading through `CommittedReader` costs against
a plain `read_committed` consumer, and what a tail after an aborted transaction costs on the
embedded broker.

On a noida-db broker started on a free 127.0.0.1 port for this run (stopped by its PID after):

Throughput: `--records` values (200 bytes) on a `--partitions` topic written by one transactional
producer in transactions of `--txn` records (as the joiner writes), read from offset 0 to the end,
best of `--repeat` alternating passes:
- `raw`: a plain confluent-kafka `Consumer` (the same client settings) assigned every partition,
  `consume()` in a loop, taking each value: the ceiling;
- `reader`: `slipstream.stream.committed.CommittedReader.poll` (order and gap checks per
  partition, position and history bookkeeping), taking each value.
`vs_raw` = reader records/s / raw records/s.

Tail after an abort (one partition): `--records` committed, one aborted transaction, then
`--commits` transactions of `--txn` records committed one by one while a reader that has read
everything tails the topic; per commit, the seconds until the reader has handed the new records
over, and the records it read again to get them (the embedded broker drops that producer's later
records for fetches that start after its abort). The same on a topic without the abort is the
baseline: `tail_vs_no_abort` = seconds per commit with the abort / without. A plain consumer
tailing the aborted topic is reported too (`plain_missed`: committed records it never handed over).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from slipstream.dev.stack import free_port, start_kafka
from slipstream.processes import stop_process
from slipstream.stream.committed import CommittedReader
from slipstream.stream.kafka import client_config, consumer_config, create_topic

log = logging.getLogger("bench.committed_reader")
VALUE = b"v" * 200


def _producer(bs: str, txn_id: str) -> Producer:
    p = Producer(client_config(bs, **{"transactional.id": txn_id, "linger.ms": 5, "batch.num.messages": 10_000}))
    p.init_transactions(30)
    return p


def _txn(p: Producer, topic: str, n: int, partitions: int, commit: bool = True) -> None:
    p.begin_transaction()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=VALUE, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(60)
    (p.commit_transaction if commit else p.abort_transaction)(60)


def _raw(bs: str, topic: str, partitions: int, total: int) -> float:
    c = Consumer(consumer_config(bs, group=f"raw-{time.monotonic_ns()}"))
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    n, started = 0, time.perf_counter()
    try:
        while n < total:
            for m in c.consume(10_000, timeout=1.0):
                if m.error() is None:
                    m.value()
                    n += 1
        return time.perf_counter() - started
    finally:
        c.close()


def _reader(bs: str, topic: str, partitions: int, total: int) -> float:
    r = CommittedReader(bs, topic, {p: 0 for p in range(partitions)}, group=f"reader-{time.monotonic_ns()}")
    n, started = 0, time.perf_counter()
    try:
        while n < total:
            for m in r.poll(10_000, 1.0):
                m.value()
                n += 1
        return time.perf_counter() - started
    finally:
        r.close()


def _tail(bs: str, topic: str, txn_id: str, records: int, txn: int, commits: int, abort: bool) -> dict[str, Any]:
    create_topic(bs, topic, 1)
    p = _producer(bs, txn_id)
    for _ in range(max(1, records // txn)):
        _txn(p, topic, txn, 1)
    if abort:
        _txn(p, topic, txn, 1, commit=False)
    reader = CommittedReader(bs, topic, {0: 0}, group=f"tail-{topic}")
    plain = Consumer(consumer_config(bs, group=f"plain-{topic}"))
    plain.assign([TopicPartition(topic, 0, 0)])
    got = plain_got = 0
    try:
        while reader.lag().get(0, 0) or not got:
            got += len(reader.poll(10_000, 0.2))
        per_commit = []
        for _ in range(commits):
            before, rereads = got, reader.stats.reread_records
            _txn(p, topic, txn, 1)
            started = time.perf_counter()
            while got < before + txn:
                got += len(reader.poll(10_000, 0.05))
                plain_got += sum(1 for m in plain.consume(10_000, timeout=0) if m.error() is None)
            per_commit.append((time.perf_counter() - started, reader.stats.reread_records - rereads))
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            plain_got += sum(1 for m in plain.consume(10_000, timeout=0.2) if m.error() is None)
        secs = sorted(s for s, _ in per_commit)
        return {"seconds_per_commit_median": secs[len(secs) // 2],
                "reread_records_per_commit": sum(n for _, n in per_commit) / len(per_commit),
                "committed": got, "plain_missed": got - plain_got}
    finally:
        reader.close()
        plain.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="slipstream bench committed_reader")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--txn", type=int, default=1000, help="records per transaction")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--commits", type=int, default=10, help="transactions committed while the tail runs")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-committed-") as tmp:
        svc = start_kafka(Path(tmp), free_port())
        bs = svc.address
        try:
            create_topic(bs, "through", args.partitions)
            p = _producer(bs, "bench-through")
            for _ in range(max(1, args.records // args.txn)):
                _txn(p, "through", args.txn, args.partitions)
            total = max(1, args.records // args.txn) * args.txn
            raw_s, reader_s = [], []
            for _ in range(args.repeat):
                raw_s.append(_raw(bs, "through", args.partitions, total))
                reader_s.append(_reader(bs, "through", args.partitions, total))
            raw_rate, reader_rate = total / min(raw_s), total / min(reader_s)
            tail_records = max(args.txn, args.records // 4)
            clean = _tail(bs, "tail-clean", "bench-clean", tail_records, args.txn, args.commits, abort=False)
            aborted = _tail(bs, "tail-aborted", "bench-aborted", tail_records, args.txn, args.commits, abort=True)
        finally:
            stop_process(svc.pid)
    return {
        "records": total, "partitions": args.partitions, "txn": args.txn,
        "raw_records_per_s": round(raw_rate), "reader_records_per_s": round(reader_rate),
        "vs_raw": round(reader_rate / raw_rate, 3),
        "tail_records_before": tail_records, "tail_commits": args.commits,
        "tail_no_abort": clean, "tail_after_abort": aborted,
        "tail_vs_no_abort": round(aborted["seconds_per_commit_median"] / max(clean["seconds_per_commit_median"], 1e-9), 2),
    }
