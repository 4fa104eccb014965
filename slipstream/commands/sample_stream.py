"""Producing a spec's samples to the sample topic, for `slipstream generate` and `slipstream import`."""

from __future__ import annotations

import logging

import pyarrow as pa

from slipstream.errors import StackError
from slipstream.samples.spec import Spec
from slipstream.settings import Settings

log = logging.getLogger(__name__)


def require_broker(settings: Settings, timeout_s: float = 10.0) -> None:
    """Fail before any work when the broker the stream goes to does not answer."""
    from slipstream.stream.kafka import KafkaAccess, wait_for_broker

    try:
        wait_for_broker(KafkaAccess.from_settings(settings), timeout_s)
    except StackError as e:
        raise StackError(f"{e}: start the local stack (`slipstream stack up`) or point SLIPSTREAM_KAFKA_BOOTSTRAP "
                         "at your broker") from None


def produce_spec_samples(settings: Settings, spec: Spec, samples: pa.Table) -> int:
    """Create the sample topic if needed and produce `samples` in table order (keyed by the
    spec's key column, in the spec's codec layout); returns the count."""
    from slipstream.dev.producers import registered_producer
    from slipstream.stream.kafka import KafkaAccess, create_topic, produce_samples

    broker = KafkaAccess.from_settings(settings)
    create_topic(broker, settings.topic, settings.topic_partitions)
    with registered_producer(settings.home, f"samples to {settings.topic}"):  # `stack down` stops it before the broker
        n = produce_samples(broker, settings.topic, samples, codec=settings.kafka_codec, spec=spec)
    log.info("produced %d samples of spec %s to %s on %s", n, spec.name, settings.topic, broker)
    return n
