"""Producing a spec's samples to the sample topic, for `slipstream generate` and `slipstream import`.

The Kafka value codecs (`slipstream.samples.codec`) and `produce_samples` (keyed by `user_id`) are
written for the default spec's columns; until they derive from the spec, a spec whose samples they
cannot carry is refused up front, with what to do instead.
"""

from __future__ import annotations

import logging

import pyarrow as pa

from slipstream.errors import ConfigError, StackError
from slipstream.samples.codec import encode_samples
from slipstream.samples.schema import sample_arrow_schema
from slipstream.samples.spec import Spec
from slipstream.settings import Settings

log = logging.getLogger(__name__)


def check_stream_codec(spec: Spec, codec: str, hint: str) -> None:
    """Raise ConfigError when the sample codec cannot carry `spec`'s samples; `hint` says what to
    do instead."""
    empty = sample_arrow_schema(spec).empty_table()
    try:
        encode_samples(empty, codec)
        empty.column("user_id")  # produce_samples keys records by it
    except (KeyError, ValueError) as e:
        raise ConfigError(
            f"the {codec} Kafka sample codec cannot carry the samples of spec {spec.name!r} yet "
            f"({e.args[0] if e.args else e}): {hint}") from None


def require_broker(settings: Settings, timeout_s: float = 10.0) -> None:
    """Fail before any work when the broker the stream goes to does not answer."""
    from slipstream.stream.kafka import wait_for_broker

    try:
        wait_for_broker(settings.kafka_bootstrap, timeout_s)
    except StackError as e:
        raise StackError(f"{e}: start the local stack (`slipstream stack up`) or point SLIPSTREAM_KAFKA_BOOTSTRAP "
                         "at your broker") from None


def produce_spec_samples(settings: Settings, spec: Spec, samples: pa.Table) -> int:
    """Create the sample topic if needed and produce `samples` in table order; returns the count."""
    from slipstream.stream.kafka import create_topic, produce_samples

    check_stream_codec(spec, settings.kafka_codec, "produce nothing to Kafka for this spec")
    create_topic(settings.kafka_bootstrap, settings.topic, settings.topic_partitions)
    n = produce_samples(settings.kafka_bootstrap, settings.topic, samples, codec=settings.kafka_codec)
    log.info("produced %d samples of spec %s to %s on %s", n, spec.name, settings.topic, settings.kafka_bootstrap)
    return n
