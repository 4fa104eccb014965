"""Shared fixtures. Servers bind 127.0.0.1 on free ports and are stopped by the PID we started."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
for p in (str(REPO), str(REPO / "plugins")):
    if p not in sys.path:
        sys.path.insert(0, p)

from slipstream.settings import Settings  # noqa: E402

# py4j's gateway says goodbye at INFO from a destructor at interpreter exit, after pytest has closed
# the stream its log handler writes to ("--- Logging error ---" at the end of a green run)
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings with SLIPSTREAM_HOME in a fresh temporary folder (also exported to the env)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("SLIPSTREAM_HOME", str(home))
    return Settings.from_env()


@pytest.fixture
def catalog(settings: Settings):  # type: ignore[no-untyped-def]
    from slipstream.lake.iceberg import get_catalog

    return get_catalog(settings)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Kafka-protocol broker (noida-db) for the whole test session."""
    from slipstream.dev.stack import free_port, start_kafka, stop_process

    home = tmp_path_factory.mktemp("kafka-home")
    svc = start_kafka(home, free_port())
    try:
        yield svc.address
    finally:
        stop_process(svc.pid)


@pytest.fixture
def topic(kafka_bootstrap: str, request: pytest.FixtureRequest) -> str:
    """A fresh topic name per test (4 partitions, created)."""
    from slipstream.stream.kafka import create_topic

    name = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name)[:80] + f"-{os.getpid()}"
    create_topic(kafka_bootstrap, name, 4)
    return name
