"""Settings of the Spark preprocessing job and how it is launched, parsed once from
`SLIPSTREAM_SPARK_*` environment variables.

The defaults run Spark in `local[*]` from the pyspark wheel, sized for a small machine. Setting
`SLIPSTREAM_SPARK_SUBMIT` or a non-local `SLIPSTREAM_SPARK_MASTER` switches the launcher to
`spark-submit` against a cluster; `SLIPSTREAM_SPARK_WRITE_MODE=native` switches the job to Spark's
own Iceberg writer (the cluster must ship the Iceberg Spark runtime and configure the catalog).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from slipstream.env_settings import settings_from_env
from slipstream.errors import ConfigError
from slipstream.settings import read_settings_file

WRITE_MODES = ("pyarrow", "native")
DEFAULT_MAX_REJECT_RATE = 0.01
DEFAULT_TARGET_FILE_MB = 128


@dataclass(frozen=True, kw_only=True)
class SparkSettings:
    master: str = "local[*]"
    """SLIPSTREAM_SPARK_MASTER: Spark master URL. Anything but `local...` means a cluster, and the
    job is started with spark-submit."""

    remote: str = ""
    """SLIPSTREAM_SPARK_REMOTE: a Spark Connect server, e.g. `sc://127.0.0.1:15002`. Set, the job is
    a thin client of that warm, long-lived Spark (no JVM or executor start per run; `slipstream
    stack up --spark-connect` starts one on 127.0.0.1 and records it here). Empty: the job starts
    its own Spark (`master`)."""

    submit: str = ""
    """SLIPSTREAM_SPARK_SUBMIT: the spark-submit executable. Set, it forces spark-submit even for a
    local master; empty with a cluster master, `spark-submit` is looked up on PATH."""

    deploy_mode: str = "client"
    """SLIPSTREAM_SPARK_DEPLOY_MODE: `client` keeps the driver (and the JSON summary) with the
    launcher; `cluster` needs the summary written to shared storage (`--summary-out`)."""

    app: str = ""
    """SLIPSTREAM_SPARK_APP: path or URI of spark_jobs/preprocess.py for spark-submit (default: the
    file in this checkout)."""

    py_files: str = ""
    """SLIPSTREAM_SPARK_PY_FILES: --py-files for spark-submit (a zip of slipstream + spark_jobs)
    when the cluster image does not have them installed."""

    driver_memory: str = "2g"
    """SLIPSTREAM_SPARK_DRIVER_MEMORY: in local mode this is all the memory Spark gets."""

    executor_memory: str = ""
    """SLIPSTREAM_SPARK_EXECUTOR_MEMORY: spark.executor.memory on a cluster (default: Spark's 1g;
    `slipstream stack up --spark-workers N` sets 512m for its 1g workers)."""

    shuffle_partitions: int = 4
    """SLIPSTREAM_SPARK_SHUFFLE_PARTITIONS: spark.sql.shuffle.partitions. Small by default because
    a local run has two cores; adaptive execution coalesces further."""

    conf: Mapping[str, str] = field(default_factory=dict)
    """SLIPSTREAM_SPARK_CONF: extra Spark configuration as a JSON object, e.g.
    '{"spark.executor.memory": "8g"}'. Wins over every default here."""

    write_mode: str = "pyarrow"
    """SLIPSTREAM_SPARK_WRITE_MODE: `pyarrow` (default, no extra jars): executors write Parquet
    through pyiceberg's FileIO and the driver commits with pyiceberg. `native`:
    `writeTo(table).overwritePartitions()` through the cluster's Iceberg Spark runtime."""

    iceberg_catalog: str = ""
    """SLIPSTREAM_SPARK_ICEBERG_CATALOG: the Spark catalog name (spark.sql.catalog.<name>) used by
    native writes; default: the Slipstream catalog name."""

    max_reject_rate: float = DEFAULT_MAX_REJECT_RATE
    """SLIPSTREAM_SPARK_MAX_REJECT_RATE: above this share of rejected raw records the run fails."""

    target_file_mb: int = DEFAULT_TARGET_FILE_MB
    """SLIPSTREAM_SPARK_TARGET_FILE_MB: a data file is closed once it reaches this size."""

    def __post_init__(self) -> None:
        if self.write_mode not in WRITE_MODES:
            raise ConfigError(
                f"SLIPSTREAM_SPARK_WRITE_MODE must be one of {', '.join(WRITE_MODES)}, got {self.write_mode!r}"
            )
        if self.deploy_mode not in ("client", "cluster"):
            raise ConfigError(f"SLIPSTREAM_SPARK_DEPLOY_MODE must be client or cluster, got {self.deploy_mode!r}")
        if self.remote and not self.remote.startswith("sc://"):
            raise ConfigError(f"SLIPSTREAM_SPARK_REMOTE must be a Spark Connect URL sc://HOST:PORT, got {self.remote!r}")
        if self.shuffle_partitions < 1:
            raise ConfigError(f"SLIPSTREAM_SPARK_SHUFFLE_PARTITIONS must be >= 1, got {self.shuffle_partitions}")
        check_job_limits(self.max_reject_rate, self.target_file_mb)

    @property
    def is_local(self) -> bool:
        return self.master.startswith("local")

    @property
    def on_loopback(self) -> bool:
        """Local mode, or a cluster master on this machine's loopback (the local stack's cluster):
        the driver then binds 127.0.0.1 too and opens no web UI."""
        host = self.master.removeprefix("spark://").split(":")[0]
        return self.is_local or host in ("127.0.0.1", "localhost")

    @property
    def uses_submit(self) -> bool:
        """spark-submit when asked for explicitly or when the master is a cluster (never for a
        Spark Connect client: it runs here and the server does the work)."""
        return not self.remote and (bool(self.submit) or not self.is_local)

    def session_conf(self) -> dict[str, str]:
        """What a Spark Connect client sets on its session: the SQL settings (the rest is the
        server's, fixed when it started)."""
        return {k: v for k, v in self.spark_conf().items() if k.startswith("spark.sql.")}

    def spark_conf(self) -> dict[str, str]:
        """The Spark configuration the job runs with (static and SQL settings)."""
        conf = {
            "spark.driver.memory": self.driver_memory,
            "spark.sql.shuffle.partitions": str(self.shuffle_partitions),
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
            "spark.ui.showConsoleProgress": "false",
            # The day's clicks, grouped per impression id, are joined to its impressions: broadcast
            # up to this size (a day of ~10M impressions' clicks), so the impressions are shuffled
            # only once, by user. Above it Spark shuffles both sides by id (still correct).
            "spark.sql.autoBroadcastJoinThreshold": "64MB",
            # Raw zones hold one file per source, day and hour: a year is ~10,000 small files. At
            # Spark's 4 MB a file a 200-day read made ~150 tasks (each paying a Python worker's
            # batch setup); what opening a local or object-store file costs is nearer 256 KB of reading.
            "spark.sql.files.openCostInBytes": str(256 * 1024),
            # A range reads one folder per day and source. Above 32 folders Spark lists them with a
            # Spark job of one task per folder (400 tasks for 200 days, tens of seconds on 2 cores);
            # the driver lists a few hundred folders in well under a second.
            "spark.sql.sources.parallelPartitionDiscovery.threshold": "1024",
        }
        if self.executor_memory:
            conf["spark.executor.memory"] = self.executor_memory
        if self.on_loopback:
            # Loopback only, and no web UI: tests and the demo must not open ports on the LAN.
            conf.update(
                {
                    "spark.driver.host": "127.0.0.1",
                    "spark.driver.bindAddress": "127.0.0.1",
                    "spark.ui.enabled": "false",
                }
            )
        conf.update(self.conf)
        return conf

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SparkSettings:
        return settings_from_env(cls, env, prefix="SLIPSTREAM_SPARK_", parsers={"conf": parse_spark_conf})

    @classmethod
    def for_home(cls, home: Path, env: Mapping[str, str] | None = None) -> SparkSettings:
        """From the environment over `<home>/settings.env` (where `stack up --spark-workers N`
        records its master), like `Settings.from_env`."""
        env = os.environ if env is None else env
        return cls.from_env({**read_settings_file(home), **{k: v for k, v in env.items() if v != ""}})

    def as_env(self) -> dict[str, str]:
        """These settings as SLIPSTREAM_SPARK_* variables, for the job's process."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f"SLIPSTREAM_SPARK_{f.name.upper()}"] = json.dumps(dict(value)) if f.name == "conf" else str(value)
        return out


def check_job_limits(max_reject_rate: float, target_file_mb: int) -> None:
    if not 0.0 <= max_reject_rate <= 1.0:
        raise ConfigError(f"max reject rate must be in [0, 1], got {max_reject_rate}")
    if target_file_mb < 1:
        raise ConfigError(f"target file size must be >= 1 MB, got {target_file_mb}")


def parse_spark_conf(raw: str) -> dict[str, str]:
    """SLIPSTREAM_SPARK_CONF: a JSON object of Spark settings; every value becomes a string."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"SLIPSTREAM_SPARK_CONF must be a JSON object of Spark settings: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"SLIPSTREAM_SPARK_CONF must be a JSON object of Spark settings, got {raw!r}")
    return {str(k): str(v) for k, v in value.items()}
