"""Kafka credentials in Airflow: from the connection SLIPSTREAM_KAFKA_CONN_ID, never from code.

In a task, `with_kafka_connection(settings)` overlays the connection on the environment's settings:
login and password are the SASL user and password; the extra may hold `bootstrap.servers`,
`security.protocol`, `sasl.mechanism`, `ssl.ca.location`; a host (and port) is the bootstrap when
the extra has none. A local training child gets them in its environment (`kafka_child_env`),
never in the rendered job spec (an XCom); pods get them from the Kafka Secret.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from slipstream.settings import Settings

_EXTRA = {
    "bootstrap.servers": "kafka_bootstrap", "security.protocol": "kafka_security_protocol",
    "sasl.mechanism": "kafka_sasl_mechanism", "ssl.ca.location": "kafka_ssl_ca_location",
    "ssl.certificate.location": "kafka_ssl_certificate_location", "ssl.key.location": "kafka_ssl_key_location",
}
KAFKA_FIELDS = ("kafka_bootstrap", "kafka_security_protocol", "kafka_sasl_mechanism", "kafka_sasl_username",
                "kafka_sasl_password", "kafka_ssl_ca_location", "kafka_ssl_certificate_location",
                "kafka_ssl_key_location", "kafka_ssl_key_password")


def with_kafka_connection(settings: Settings, connection: Any = None) -> Settings:
    """`settings` with the Kafka connection's values (unchanged when SLIPSTREAM_KAFKA_CONN_ID is empty)."""
    if not settings.kafka_conn_id and connection is None:
        return settings
    if connection is None:
        from airflow.sdk import Connection

        connection = Connection.get(settings.kafka_conn_id)
    extra = connection.extra_dejson or {}
    given: dict[str, str] = {name: str(extra[key]) for key, name in _EXTRA.items() if extra.get(key)}
    if "kafka_bootstrap" not in given and connection.host:
        given["kafka_bootstrap"] = f"{connection.host}:{connection.port}" if connection.port else connection.host
    if connection.login:
        given["kafka_sasl_username"] = connection.login
    if connection.password:
        given["kafka_sasl_password"] = connection.password
    return dataclasses.replace(settings, **cast(dict[str, Any], given))  # every key names a text field (KAFKA_FIELDS)


def kafka_child_env(settings: Settings) -> dict[str, str]:
    """SLIPSTREAM_KAFKA_* of the settings (secrets included) for a child process's environment."""
    return {f"SLIPSTREAM_{name.upper()}": str(getattr(settings, name)) for name in KAFKA_FIELDS if getattr(settings, name)}
