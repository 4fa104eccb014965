"""A producer of the local stack, for tests: registers itself with the stack's home, writes to a
topic until SIGTERM, then flushes and exits 0. Each acknowledged record goes to a log file as
"partition offset value" (the test checks the broker still holds them all).

    python tests/stack_writer.py HOME BOOTSTRAP TOPIC ACK_LOG
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from slipstream.dev.producers import registered_producer
from slipstream.processes import Terminated, exit_on_sigterm


def main(home: str, bootstrap: str, topic: str, ack_log: str) -> int:
    exit_on_sigterm()
    acks = open(ack_log, "a", buffering=1)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})

    def acked(err: Any, msg: Any) -> None:
        if err is None:
            acks.write(f"{msg.partition()} {msg.offset()} {msg.value().decode()}\n")

    with registered_producer(Path(home), "test-writer"):
        try:
            i = 0
            while True:
                try:
                    producer.produce(topic, value=b"w%d" % i, key=b"%d" % (i % 7), on_delivery=acked)
                    i += 1
                except BufferError:
                    producer.poll(0.05)
                producer.poll(0)
                time.sleep(0.0005)
        except Terminated:
            left = producer.flush(10)
            acks.write(f"# stopped, {left} not acknowledged\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
