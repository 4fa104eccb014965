"""Deployment settings, parsed once from the environment into a typed object.

Every setting is an environment variable `SLIPSTREAM_<NAME>`; the defaults describe the embedded
local stack under `.slipstream/` in the working directory. Components take the fields they need
as arguments: nothing below the CLI/DAG edge reads the environment itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Mapping

from slipstream.errors import ConfigError

BACKENDS = ("local", "kubernetes")
KAFKA_CODECS = ("json", "binary")


@dataclass(frozen=True, kw_only=True)
class Settings:
    home: Path = field(default_factory=lambda: Path(".slipstream").resolve())
    """SLIPSTREAM_HOME: state of the local stack (broker data, catalog, warehouse, runs, PIDs)."""

    catalog: str = "local"
    """SLIPSTREAM_CATALOG: pyiceberg catalog name. `local` is the SQLite catalog under home;
    any other name is looked up through pyiceberg's own configuration (.pyiceberg.yaml or
    PYICEBERG_CATALOG__<NAME>__* variables), e.g. a REST catalog in production."""

    namespace: str = "slipstream"
    """SLIPSTREAM_NAMESPACE: Iceberg namespace holding `samples` and the other tables."""

    warehouse: str = ""
    """SLIPSTREAM_WAREHOUSE: warehouse location for the local catalog (default file://<home>/warehouse;
    s3://warehouse/... puts it on the S3 server)."""

    raw_dir: str = ""
    """SLIPSTREAM_RAW_DIR: raw zone with impressions/ and clicks/ (default <home>/raw)."""

    kafka_bootstrap: str = "127.0.0.1:19092"
    """SLIPSTREAM_KAFKA_BOOTSTRAP: bootstrap.servers of the broker holding the sample stream."""

    kafka_port: int = 19092
    """SLIPSTREAM_KAFKA_PORT: port the local stack's broker listens on (127.0.0.1 only)."""

    topic: str = "samples"
    """SLIPSTREAM_TOPIC: the online-joined sample stream."""

    topic_partitions: int = 4
    """SLIPSTREAM_TOPIC_PARTITIONS: partitions of the sample topic when Slipstream creates it."""

    kafka_codec: str = "json"
    """SLIPSTREAM_KAFKA_CODEC: value format Slipstream's producers write, `json` (readable) or `binary`
    (compact, several times cheaper to decode; `slipstream.samples.binary_codec`). Readers take either."""

    cache_dir: str = ""
    """SLIPSTREAM_CACHE_DIR: node-local cache of warehouse files (default <home>/cache)."""

    runs_dir: str = ""
    """SLIPSTREAM_RUNS_DIR: run artifacts: checkpoints, metrics, reports (default <home>/runs)."""

    training_backend: str = "local"
    """SLIPSTREAM_TRAINING_BACKEND: `local` (torchrun subprocess) or `kubernetes` (a pod)."""

    def __post_init__(self) -> None:
        if self.training_backend not in BACKENDS:
            raise ConfigError(
                f"SLIPSTREAM_TRAINING_BACKEND must be one of {', '.join(BACKENDS)}, "
                f"got {self.training_backend!r}"
            )
        if self.kafka_codec not in KAFKA_CODECS:
            raise ConfigError(f"SLIPSTREAM_KAFKA_CODEC must be one of {', '.join(KAFKA_CODECS)}, got {self.kafka_codec!r}")
        if not 1 <= self.kafka_port <= 65535:
            raise ConfigError(f"SLIPSTREAM_KAFKA_PORT must be a TCP port, got {self.kafka_port}")
        if self.topic_partitions < 1:
            raise ConfigError(f"SLIPSTREAM_TOPIC_PARTITIONS must be >= 1, got {self.topic_partitions}")
        home = Path(self.home).resolve()
        object.__setattr__(self, "home", home)
        for name, default in (
            ("warehouse", (home / "warehouse").as_uri()),
            ("raw_dir", str(home / "raw")),
            ("cache_dir", str(home / "cache")),
            ("runs_dir", str(home / "runs")),
        ):
            if not getattr(self, name):
                object.__setattr__(self, name, default)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        kwargs: dict[str, object] = {}
        for f in fields(cls):
            key = f"SLIPSTREAM_{f.name.upper()}"
            if key not in env or env[key] == "":
                continue
            raw = env[key]
            if f.name in ("kafka_port", "topic_partitions"):
                try:
                    kwargs[f.name] = int(raw)
                except ValueError:
                    raise ConfigError(f"{key} must be an integer, got {raw!r}") from None
            elif f.name == "home":
                kwargs[f.name] = Path(raw)
            else:
                kwargs[f.name] = raw
        return cls(**kwargs)  # type: ignore[arg-type]

    def as_env(self) -> dict[str, str]:
        """The settings as environment variables, for child processes (torchrun, spark-submit)."""
        return {f"SLIPSTREAM_{f.name.upper()}": str(getattr(self, f.name)) for f in fields(self)}

    @property
    def table(self) -> str:
        return f"{self.namespace}.samples"
