"""Deployment settings, parsed once from the environment into a typed object.

Every setting is an environment variable `SLIPSTREAM_<NAME>` (read by `slipstream.env_settings`,
on pydantic-settings); the defaults describe the embedded local stack under `.slipstream/` in the
working directory. Components take the fields they need
as arguments: nothing below the CLI/DAG edge reads the environment itself.

A settings file `<SLIPSTREAM_HOME>/settings.env` (`NAME=value` lines) supplies values the
environment leaves unset: `slipstream stack up` writes the endpoints it started there (the broker's
address, the S3 server's endpoint and keys), so every later command, task and child process of that
home talks to exactly those servers. A variable set in the environment always wins.

A `Settings` describes one data set of the deployment: the one its spec (`SLIPSTREAM_SPEC`) names.
Its Iceberg namespace, sample topic, dead-letter topic, raw zone and model registry are named from
the data set (the spec file's name, `dataset_name`), so two data sets on one deployment never share
a table, a topic or a champion: `criteo` gets namespace `slipstream_criteo`, topics
`criteo.samples` and `criteo.samples.dlq`, raw zone `<home>/raw/criteo`, registry
`<home>/registry/criteo` (the last two under SLIPSTREAM_RAW_ROOT and SLIPSTREAM_REGISTRY_ROOT, which
every data set shares). Each name can be set: `SLIPSTREAM_DATASET__<NAME>__<FIELD>` for one data
set (`SLIPSTREAM_DATASET__CRITEO__TOPIC=ctr.criteo`), or the plain variable (`SLIPSTREAM_TOPIC`) for
the data set of `SLIPSTREAM_SPEC`. `for_dataset` gives the settings of another data set.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from slipstream.env_settings import settings_from_env
from slipstream.errors import ConfigError

BACKENDS = ("local", "kubernetes")
KAFKA_CODECS = ("json", "binary")
SETTINGS_FILE = "settings.env"
DATASET_FIELDS = ("namespace", "topic", "dlq_topic", "raw_dir", "registry")
"""The settings named from the data set (see the module docstring); each can be set per data set."""
DATASET_ENV_PREFIX = "SLIPSTREAM_DATASET__"
DEFAULT_SPEC = "synthetic"
_SPEC_SUFFIXES = (".yaml", ".yml", ".json")
SECRET_FIELDS = ("s3_secret_access_key", "catalog_credential", "kafka_sasl_username", "kafka_sasl_password",
                 "kafka_ssl_key_password")
"""Never copied into a child's environment by `as_env` (pods get them from Secrets; local
children read them from the settings file of the same home)."""


@dataclass(frozen=True, kw_only=True)
class Settings:
    home: Path = field(default_factory=lambda: Path(".slipstream").resolve())
    """SLIPSTREAM_HOME: state of the local stack (broker data, catalog, warehouse, runs, PIDs)."""

    catalog: str = "local"
    """SLIPSTREAM_CATALOG: pyiceberg catalog name. `local` is the SQLite catalog under home;
    any other name is looked up through pyiceberg's own configuration (.pyiceberg.yaml or
    PYICEBERG_CATALOG__<NAME>__* variables), e.g. a REST catalog in production, unless
    SLIPSTREAM_CATALOG_URI names a REST catalog directly."""

    catalog_uri: str = ""
    """SLIPSTREAM_CATALOG_URI: URL of an Iceberg REST catalog (e.g. http://127.0.0.1:8181). Set, the
    catalog is that server, with SLIPSTREAM_WAREHOUSE as its warehouse and the S3 settings as its
    FileIO (`slipstream stack up --profile cluster` sets it to SeaweedFS's REST catalog)."""

    catalog_credential: str = field(default="", repr=False)
    """SLIPSTREAM_CATALOG_CREDENTIAL: `client_id:client_secret` the REST catalog exchanges for a
    token (OAuth2 client credentials); empty: no authentication."""

    namespace: str = ""
    """SLIPSTREAM_NAMESPACE: Iceberg namespace holding the data set's `samples` and its other tables
    (default `slipstream_<data set>`)."""

    warehouse: str = ""
    """SLIPSTREAM_WAREHOUSE: warehouse location for the local catalog (default file://<home>/warehouse;
    s3://warehouse/... puts it on the S3 server)."""

    raw_dir: str = ""
    """SLIPSTREAM_RAW_DIR: the data set's raw zone, one folder per source of its spec (default
    <raw_root>/<data set>)."""

    raw_root: str = ""
    """SLIPSTREAM_RAW_ROOT: the folder (or s3://bucket/prefix) holding each data set's raw zone,
    `<raw_root>/<data set>` (default <home>/raw)."""

    kafka_bootstrap: str = ""
    """SLIPSTREAM_KAFKA_BOOTSTRAP: bootstrap.servers of the broker holding the sample stream
    (default: the local stack's broker, 127.0.0.1:<kafka_port>)."""

    kafka_port: int = 19092
    """SLIPSTREAM_KAFKA_PORT: port the local stack's broker listens on (127.0.0.1 only)."""

    kafka_security_protocol: str = ""
    """SLIPSTREAM_KAFKA_SECURITY_PROTOCOL: PLAINTEXT (empty), SSL, SASL_PLAINTEXT or SASL_SSL, for
    every Kafka client (`slipstream.stream.kafka.client_config`)."""

    kafka_sasl_mechanism: str = ""
    """SLIPSTREAM_KAFKA_SASL_MECHANISM: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (with SASL_*)."""

    kafka_sasl_username: str = field(default="", repr=False)
    """SLIPSTREAM_KAFKA_SASL_USERNAME: SASL user (pods: from the Kafka Secret; Airflow tasks: the
    connection SLIPSTREAM_KAFKA_CONN_ID when set)."""

    kafka_sasl_password: str = field(default="", repr=False)
    """SLIPSTREAM_KAFKA_SASL_PASSWORD: SASL password (a secret: never in logs or a child's settings)."""

    kafka_ssl_ca_location: str = ""
    """SLIPSTREAM_KAFKA_SSL_CA_LOCATION: CA bundle that signed the brokers' certificates (TLS)."""

    kafka_ssl_certificate_location: str = ""
    """SLIPSTREAM_KAFKA_SSL_CERTIFICATE_LOCATION: client certificate (mutual TLS)."""

    kafka_ssl_key_location: str = ""
    """SLIPSTREAM_KAFKA_SSL_KEY_LOCATION: client private key (mutual TLS)."""

    kafka_ssl_key_password: str = field(default="", repr=False)
    """SLIPSTREAM_KAFKA_SSL_KEY_PASSWORD: password of the client key (a secret)."""

    kafka_conn_id: str = ""
    """SLIPSTREAM_KAFKA_CONN_ID: Airflow connection whose login/password (and extra
    `security.protocol`, `sasl.mechanism`, `ssl.ca.location`) the DAG tasks use for Kafka."""

    topic: str = ""
    """SLIPSTREAM_TOPIC: the data set's online-joined sample stream (default `<data set>.samples`)."""

    dlq_topic: str = ""
    """SLIPSTREAM_DLQ_TOPIC: where records of the sample stream that cannot be trained on go, with
    the reason in their headers (default `<topic>.dlq`)."""

    registry: str = ""
    """SLIPSTREAM_REGISTRY: the data set's model registry, a folder or s3://bucket/prefix (default
    <registry_root>/<data set>); its champion is the data set's."""

    registry_root: str = ""
    """SLIPSTREAM_REGISTRY_ROOT: the folder (or s3://bucket/prefix) holding each data set's registry,
    `<registry_root>/<data set>` (default <home>/registry)."""

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

    spec: str = DEFAULT_SPEC
    """SLIPSTREAM_SPEC: the data set's feature spec: a shipped spec's name (synthetic, criteo,
    ratings) or the path of a YAML file (docs/features.md). The file's name names the data set."""

    specs_dir: str = ""
    """SLIPSTREAM_SPECS_DIR: a folder of spec files, one data set each; set, the Airflow DAGs are
    built once per file (`daily_retrain__<data set>` ...). Empty: one set of DAGs, for SLIPSTREAM_SPEC."""

    s3_endpoint: str = ""
    """SLIPSTREAM_S3_ENDPOINT: endpoint URL of the S3 store holding the warehouse (empty: AWS's)."""

    s3_access_key_id: str = ""
    """SLIPSTREAM_S3_ACCESS_KEY_ID: S3 access key (empty: the client's default credential chain)."""

    s3_secret_access_key: str = field(default="", repr=False)
    """SLIPSTREAM_S3_SECRET_ACCESS_KEY: S3 secret key."""

    s3_region: str = ""
    """SLIPSTREAM_S3_REGION: S3 region."""

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
        if not self.kafka_bootstrap:
            object.__setattr__(self, "kafka_bootstrap", f"127.0.0.1:{self.kafka_port}")
        name = dataset_name(self.spec)
        topic = self.topic or f"{name}.samples"
        raw_root = self.raw_root or str(home / "raw")
        registry_root = self.registry_root or str(home / "registry")
        for name_, default in (
            ("raw_root", raw_root),
            ("registry_root", registry_root),
            ("namespace", f"slipstream_{name.replace('-', '_')}"),
            ("topic", topic),
            ("dlq_topic", f"{topic}.dlq"),
            ("raw_dir", f"{raw_root.rstrip('/')}/{name}"),
            ("registry", f"{registry_root.rstrip('/')}/{name}"),
            ("warehouse", (home / "warehouse").as_uri()),
            ("cache_dir", str(home / "cache")),
            ("runs_dir", str(home / "runs")),
        ):
            if not getattr(self, name_):
                object.__setattr__(self, name_, default)

    @property
    def dataset(self) -> str:
        """The data set's name: its spec file's (`dataset_name`)."""
        return dataset_name(self.spec)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """From the environment (or `env`), over the settings file of the home it names."""
        env = os.environ if env is None else env
        home = Path(env.get("SLIPSTREAM_HOME") or ".slipstream")
        merged = {**read_settings_file(home), **{k: v for k, v in env.items() if v != ""}}
        name = dataset_name(merged.get("SLIPSTREAM_SPEC") or DEFAULT_SPEC)
        for key, value in dataset_overrides(merged, name).items():  # the data set's own names win
            merged[f"SLIPSTREAM_{key.upper()}"] = value
        return settings_from_env(cls, merged, prefix="SLIPSTREAM_")

    def for_dataset(self, spec: str, env: Mapping[str, str] | None = None) -> Settings:
        """The settings of the data set of `spec` (a shipped name or a spec file's path) on this
        deployment: its own names (`SLIPSTREAM_DATASET__<NAME>__*` in `env`, the process
        environment by default, over the settings file, else named from the data set); the plain
        SLIPSTREAM_NAMESPACE/TOPIC/... belong to this settings' own data set only."""
        name = dataset_name(spec)
        if name == self.dataset:
            return dataclasses.replace(self, spec=spec)
        env = os.environ if env is None else env
        merged = {**read_settings_file(self.home), **{k: v for k, v in env.items() if v != ""}}
        own = dataset_overrides(merged, name)
        names: dict[str, Any] = {f: own.get(f, "") for f in DATASET_FIELDS}  # "" : named from the data set
        return dataclasses.replace(self, spec=spec, **names)

    def as_env(self) -> dict[str, str]:
        """The settings as environment variables, for child processes (torchrun, spark-submit);
        secrets stay out (see SECRET_FIELDS)."""
        return {
            f"SLIPSTREAM_{f.name.upper()}": str(getattr(self, f.name))
            for f in fields(self)
            if f.name not in SECRET_FIELDS
        }

    def s3_io_properties(self) -> dict[str, str]:
        """pyiceberg/pyarrow S3 FileIO properties (`s3.endpoint`, keys, region) of the settings set."""
        props = {
            "s3.endpoint": self.s3_endpoint,
            "s3.access-key-id": self.s3_access_key_id,
            "s3.secret-access-key": self.s3_secret_access_key,
            "s3.region": self.s3_region,
        }
        return {k: v for k, v in props.items() if v}

    @property
    def table(self) -> str:
        return f"{self.namespace}.samples"


def dataset_name(spec: str) -> str:
    """A data set's name from its spec reference: a shipped spec's name as it is, a spec file's
    name without its suffix (`/specs/avazu.yaml` -> `avazu`), lower case, any character other than
    a letter, digit, `-` or `_` replaced by `_`. It names the data set's DAGs, tables and topics."""
    base = str(spec).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    for suffix in _SPEC_SUFFIXES:
        if base.lower().endswith(suffix):
            base = base[: -len(suffix)]
            break
    name = re.sub(r"[^a-z0-9_-]", "_", base.lower())
    if not name or not name[0].isalpha():
        raise ConfigError(f"spec {spec!r} does not name a data set: a spec file's name must start with a letter "
                          "(it names the data set's DAGs, tables and topics)")
    return name


def dataset_overrides(env: Mapping[str, str], name: str) -> dict[str, str]:
    """The names set for data set `name` in `env`: `SLIPSTREAM_DATASET__<NAME>__<FIELD>` (NAME upper
    case, `-` as `_`), by field; an unknown FIELD is refused with the valid ones."""
    prefix = f"{DATASET_ENV_PREFIX}{name.upper().replace('-', '_')}__"
    out: dict[str, str] = {}
    for key, value in env.items():
        if not key.startswith(prefix) or value == "":
            continue
        field_name = key[len(prefix):].lower()
        if field_name not in DATASET_FIELDS:
            raise ConfigError(f"{key}: {field_name.upper()} is not a per-data-set setting; valid: "
                              f"{', '.join(prefix + f.upper() for f in DATASET_FIELDS)}")
        out[field_name] = value
    return out


def read_settings_file(home: Path) -> dict[str, str]:
    """`<home>/settings.env` as a dict (empty when there is none). Blank lines and `#` comments are
    skipped; a line without `=` is refused with its number."""
    path = Path(home) / SETTINGS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{path}:{n}: expected NAME=value, got {line!r}: fix or delete the line")
        out[key.strip()] = value.strip()
    return out


def write_private_file(path: Path, text: str) -> Path:
    """Replace `path` with `text`, atomically and readable by its owner only, from the first byte:
    the content goes into a file created with mode 0600 (mkstemp) that is then renamed into place,
    so no moment exists in which a secret sits in a file with the default permissions."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_settings_file(home: Path, values: Mapping[str, str]) -> Path:
    """Replace `<home>/settings.env` with `values`, atomically and readable by the owner only
    (it may hold keys): the file is created with mode 0600, never widened afterwards."""
    lines = ["# written by `slipstream stack up`: the endpoints it started; the environment wins\n"]
    for key in sorted(values):
        if "\n" in values[key]:
            raise ConfigError(f"setting {key} must be one line, got {values[key]!r}")
        lines.append(f"{key}={values[key]}\n")
    return write_private_file(Path(home) / SETTINGS_FILE, "".join(lines))


def remove_settings_file(home: Path) -> None:
    (Path(home) / SETTINGS_FILE).unlink(missing_ok=True)
