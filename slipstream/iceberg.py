"""Iceberg catalog access and the tables Slipstream owns.

Catalogs are looked up by name: `local` is the SQLite `SqlCatalog` of the embedded stack; any
other name goes through pyiceberg's own configuration (`.pyiceberg.yaml`,
`PYICEBERG_CATALOG__<NAME>__*`), so production points at a REST/Glue/Hive catalog without code.
"""

from __future__ import annotations

import logging
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from slipstream.schema import ICEBERG_SCHEMA, PARTITION_SPEC, SAMPLES_TABLE
from slipstream.settings import Settings

log = logging.getLogger(__name__)

LOCAL_CATALOG = "local"


def local_catalog_properties(settings: Settings) -> dict[str, str]:
    props = {
        "type": "sql",
        "uri": f"sqlite:///{settings.home / 'catalog.db'}",
        "warehouse": settings.warehouse,
    }
    props.update(s3_io_properties(settings))  # env keys, else the local S3 server's
    return props


def s3_properties_from_env() -> dict[str, str]:
    """pyiceberg S3 FileIO properties from SLIPSTREAM_S3_* variables (never from code)."""
    import os

    mapping = {
        "SLIPSTREAM_S3_ENDPOINT": "s3.endpoint",
        "SLIPSTREAM_S3_ACCESS_KEY_ID": "s3.access-key-id",
        "SLIPSTREAM_S3_SECRET_ACCESS_KEY": "s3.secret-access-key",
        "SLIPSTREAM_S3_REGION": "s3.region",
    }
    return {prop: os.environ[var] for var, prop in mapping.items() if os.environ.get(var)}


def get_catalog(settings: Settings) -> Catalog:
    if settings.catalog == LOCAL_CATALOG:
        settings.home.mkdir(parents=True, exist_ok=True)
        return load_catalog(LOCAL_CATALOG, **local_catalog_properties(settings))
    return load_catalog(settings.catalog)


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    try:
        catalog.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass


def ensure_table(
    catalog: Catalog,
    identifier: str,
    schema: Schema,
    partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
    properties: dict[str, Any] | None = None,
) -> Table:
    """Load the table, creating it (and its namespace) when missing. Safe to race."""
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    ensure_namespace(catalog, identifier.rsplit(".", 1)[0])
    try:
        return catalog.create_table(
            identifier, schema=schema, partition_spec=partition_spec, properties=properties or {}
        )
    except TableAlreadyExistsError:
        return catalog.load_table(identifier)


def samples_table(catalog: Catalog, namespace: str) -> Table:
    return ensure_table(
        catalog,
        f"{namespace}.{SAMPLES_TABLE}",
        ICEBERG_SCHEMA,
        PARTITION_SPEC,
        {"write.parquet.compression-codec": "zstd"},
    )


# --- S3 warehouse settings (cache team) -------------------------------------------------------
# The warehouse is on S3 when SLIPSTREAM_WAREHOUSE starts with s3:// (e.g. s3://warehouse/wh on the
# local SeaweedFS). Credentials come from SLIPSTREAM_S3_* variables (set them from an Airflow
# Connection in production); for the local stack they default to the keys the S3 server under
# SLIPSTREAM_HOME generated, so nothing secret is ever in code or in the repository.

S3_MODES = ("auto", "on", "off")


def warehouse_on_s3(settings: Settings) -> bool:
    return settings.warehouse.startswith(("s3://", "s3a://"))


def s3_mode() -> str:
    """SLIPSTREAM_S3: whether `stack up` starts the local S3 server: `auto` (default: only when the
    warehouse is on s3://, so a local-disk stack stays fast), `on` (always), `off` (never)."""
    import os

    from slipstream.errors import ConfigError

    mode = os.environ.get("SLIPSTREAM_S3", "").strip().lower() or "auto"
    if mode not in S3_MODES:
        raise ConfigError(f"SLIPSTREAM_S3 must be one of {', '.join(S3_MODES)}, got {mode!r}")
    return mode


def local_s3_properties(settings: Settings) -> dict[str, str]:
    """FileIO properties of the local stack's S3 server under SLIPSTREAM_HOME, if it was started."""
    from slipstream.s3server import S3Server

    endpoint = S3Server(settings.home).last_endpoint()
    return endpoint.io_properties() if endpoint else {}


def s3_io_properties(settings: Settings) -> dict[str, str]:
    """pyiceberg/pyarrow S3 FileIO properties: the local server's, overridden by SLIPSTREAM_S3_*."""
    return {**local_s3_properties(settings), **s3_properties_from_env()}
