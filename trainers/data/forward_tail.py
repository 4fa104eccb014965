"""The forward tail: the last part of the stream after T, by event time, held out of training.

At the handoff rank 0 reads the newest records of every partition (the last `look_back` offsets,
uncommitted ones included: only their event times are wanted) and puts the tail's start at
`T + (1 - share) * (newest event time - T)`. From then on every stream record with an event time
at or after it is kept out of training (`trainers.data.kafka_source`), and at the end of the run
the final model, its baselines and the champion are scored on those records in the same step
(`trainers.eval.sets`): rows later than anything the model trained on, which decide promotion.

The start is fixed once, in the checkpoint (`TrainState.forward_tail_start_us`), so a resumed
run holds out exactly the same records. Records arriving during the run with later event times
fall in the tail too. A continuous run has no tail (its live model is judged prequentially).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaException, TopicPartition

from slipstream.samples.codec import decode_samples
from slipstream.samples.spec import Spec
from slipstream.stream.kafka import Broker, consumer_config

log = logging.getLogger(__name__)

LOOK_BACK = 256
"""Records read at the end of each partition: producers write roughly in event-time order, so the
newest event is among the last ones (a late record only moves the tail's start earlier)."""


def newest_event_us(broker: Broker, topic: str, spec: Spec, look_back: int = LOOK_BACK, timeout_s: float = 20.0) -> int | None:
    """The newest event time among the last `look_back` records of every partition (None: the
    topic holds none). Reads uncommitted records too: a transactional topic's last offsets are
    markers, and some brokers hand a read_committed reader nothing past an abort marker."""
    c = Consumer(consumer_config(broker, group="slipstream-forward-tail", **{"isolation.level": "read_uncommitted"}))
    newest: int | None = None
    try:
        meta = c.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        ends: dict[int, int] = {}
        starts = []
        for p in sorted(meta.partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s, cached=False)
            if high > low:
                ends[p] = high
                starts.append(TopicPartition(topic, p, max(low, high - look_back)))
        if not starts:
            return None
        c.assign(starts)
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            msgs = [m for m in c.consume(num_messages=10_000, timeout=0.5) if m.error() is None]
            if msgs:
                newest = _max_event(msgs, spec, newest)
            for tp in c.position([TopicPartition(topic, p) for p in list(ends)]):
                if tp.offset >= ends[tp.partition]:
                    ends.pop(tp.partition)
    except KafkaException as e:
        log.warning("the newest records of %s could not be read (%s): no forward tail", topic, e)
        return None
    finally:
        c.close()
    return newest


def _max_event(msgs: list, spec: Spec, newest: int | None) -> int | None:  # type: ignore[type-arg]  # confluent Messages
    decoded = decode_samples([m.value() for m in msgs], spec).table
    if decoded.num_rows:
        us = int(pc.max(pc.cast(decoded.column("event_time"), pa.int64())).as_py())
    else:  # no sample decodes: the record timestamps are event times in ms (the producers set them)
        stamps = [m.timestamp()[1] for m in msgs if m.timestamp()[1] > 0]
        if not stamps:
            return newest
        us = int(max(stamps)) * 1000
    return us if newest is None else max(newest, us)


def plan_forward_tail(broker: Broker, topic: str, spec: Spec, t_us: int, share: float) -> int | None:
    """Rank 0 at the handoff: where the forward tail starts (None: no tail: `share` 0, or no
    record after T yet)."""
    if share <= 0:
        return None
    tail = tail_start_us(t_us, newest_event_us(broker, topic, spec), share)
    when = datetime.fromtimestamp(tail / 1e6, tz=UTC).isoformat() if tail is not None else None
    log.info("forward tail: stream rows with event time from %s on are never trained (the last %.0f%% of the stream "
             "after T)", when or "(none: no record after T yet)", 100 * share)
    return tail


def tail_start_us(t_us: int, newest_us: int | None, share: float) -> int | None:
    """Where the tail starts: the last `share` of [T, newest event] (None: no tail)."""
    if share <= 0 or newest_us is None or newest_us <= t_us:
        return None
    return int(t_us + np.floor((1.0 - share) * (newest_us - t_us)))
