"""Iceberg catalog access and the tables Slipstream owns.

Catalogs are looked up by name: `local` is the SQLite `SqlCatalog` of the embedded stack; with
SLIPSTREAM_CATALOG_URI the catalog is that Iceberg REST server (the cluster profile: SeaweedFS's);
any other name goes through pyiceberg's own configuration (`.pyiceberg.yaml`,
`PYICEBERG_CATALOG__<NAME>__*`), so production points at a REST/Glue/Hive catalog without code.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import CommitFailedException, NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from slipstream.errors import ConfigError
from slipstream.samples.schema import ICEBERG_SCHEMA, SAMPLES_TABLE, iceberg_schema
from slipstream.samples.schema import partition_spec as day_partition_spec
from slipstream.samples.spec import Spec
from slipstream.settings import Settings

log = logging.getLogger(__name__)

LOCAL_CATALOG = "local"


def local_catalog_properties(settings: Settings) -> dict[str, str]:
    props = {
        "type": "sql",
        "uri": f"sqlite:///{settings.home / 'catalog.db'}",
        "warehouse": settings.warehouse,
    }
    props.update(settings.s3_io_properties())
    return props


def rest_catalog_properties(settings: Settings) -> dict[str, str]:
    """An Iceberg REST catalog at SLIPSTREAM_CATALOG_URI over the S3 warehouse."""
    props = {"type": "rest", "uri": settings.catalog_uri, "warehouse": settings.warehouse}
    if settings.catalog_credential:
        props["credential"] = settings.catalog_credential
        props["oauth2-server-uri"] = f"{settings.catalog_uri.rstrip('/')}/v1/oauth/tokens"
    props.update(settings.s3_io_properties())
    return props


def get_catalog(settings: Settings) -> Catalog:
    if settings.catalog_uri:
        return load_catalog(settings.catalog, **rest_catalog_properties(settings))
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


def samples_table(catalog: Catalog, namespace: str, spec: Spec | None = None) -> Table:
    """The `samples` table, created from the spec's schema when missing. With a spec, a table that
    lacks some of the spec's columns is evolved (the new columns added by name, new field ids;
    older snapshots stay readable and their rows read the new columns as null, which the trainer
    turns into the feature's default). A column whose type the spec changed is refused: a changed
    feature needs a new name."""
    schema = ICEBERG_SCHEMA if spec is None else iceberg_schema(spec)
    table = ensure_table(catalog, f"{namespace}.{SAMPLES_TABLE}", schema, day_partition_spec(schema),
                         {"write.parquet.compression-codec": "zstd"})
    if spec is None:
        return table
    current = {f.name: f for f in table.schema().fields}
    for f in schema.fields:
        have = current.get(f.name)
        # by shape: a list's element id depends on the column count, so it differs across versions
        if have is not None and str(have.field_type) != str(f.field_type):
            raise ConfigError(
                f"column {f.name} of {'.'.join(table.name())} is {have.field_type} but spec {spec.name} v{spec.version} "
                f"makes it {f.field_type}: give the changed feature a new name (the old column stays for old snapshots)"
            )
    missing = [f.name for f in schema.fields if f.name not in current]
    if missing:
        for attempt in range(5):
            try:
                with table.update_schema() as update:
                    update.union_by_name(schema)
                break
            except CommitFailedException:  # another day's job evolved it at the same time
                table.refresh()
                if all(n in {f.name for f in table.schema().fields} for n in missing):
                    break
                time.sleep(0.2 * (attempt + 1))
        table.refresh()
        log.info("evolved %s for spec %s v%s: added %s", ".".join(table.name()), spec.name, spec.version, ", ".join(missing))
    return table


# --- Day overwrite commits and the rejects table (Spark preprocessing) -----------------------

# Imports of this section live here, not at the top, so that appends by other teams merge cleanly.
import random  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from datetime import UTC, date, datetime, timedelta  # noqa: E402

from pyiceberg.exceptions import ValidationException  # noqa: E402
from pyiceberg.expressions import And, BooleanExpression, EqualTo, GreaterThanOrEqual, LessThan, Or, Reference  # noqa: E402
from pyiceberg.expressions.literals import literal  # noqa: E402
from pyiceberg.io.pyarrow import parquet_files_to_data_files  # noqa: E402
from pyiceberg.manifest import DataFile  # noqa: E402
from pyiceberg.partitioning import PartitionField  # noqa: E402
from pyiceberg.table import TableProperties  # noqa: E402
from pyiceberg.transforms import DayTransform, IdentityTransform  # noqa: E402
from pyiceberg.types import DateType, LongType, NestedField, StringType  # noqa: E402

from slipstream.errors import CommitConflict  # noqa: E402
from slipstream.samples.schema import REJECTS_TABLE  # noqa: E402

REJECTS_SCHEMA = Schema(
    NestedField(1, "day", DateType(), required=False, doc="raw day the record was read for"),
    NestedField(2, "run_id", StringType(), required=False),
    NestedField(3, "record_kind", StringType(), required=False, doc="impression or click"),
    NestedField(4, "source_file", StringType(), required=False),
    NestedField(5, "reason", StringType(), required=False, doc="why the record was rejected"),
    NestedField(6, "raw_line", StringType(), required=False, doc="the line as read, or the parsed fields as JSON"),
    NestedField(7, "line", LongType(), required=False, doc="line of source_file (1-based; Parquet: the row)"),
)
REJECTS_PARTITION_SPEC = PartitionSpec(
    PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="day")
)
_EPOCH = date(1970, 1, 1)


def rejects_table(catalog: Catalog, namespace: str) -> Table:
    """`samples_rejects`: raw records the preprocessing job refused, partitioned by day. A table
    from before rejects had their `line` gets the column (older rows read it as null)."""
    table = ensure_table(catalog, f"{namespace}.{REJECTS_TABLE}", REJECTS_SCHEMA, REJECTS_PARTITION_SPEC)
    missing = [f for f in REJECTS_SCHEMA.fields if f.name not in {g.name for g in table.schema().fields}]
    if missing:
        try:
            with table.update_schema() as update:
                for f in missing:
                    update.add_column(f.name, f.field_type, doc=f.doc)
        except CommitFailedException:  # another job evolved it first
            pass
        table = catalog.load_table(f"{namespace}.{REJECTS_TABLE}")
    return table


def day_predicate(table: Table, day: date) -> BooleanExpression:
    """The rows of `day` in a table partitioned by `day(<timestamp>)` or by a date column."""
    spec = table.spec()
    schema = table.schema()
    for pf in spec.fields:
        source = schema.find_field(pf.source_id)
        if isinstance(pf.transform, DayTransform):
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            end = start + timedelta(days=1)
            column = Reference(source.name)
            return And(
                GreaterThanOrEqual(term=column, value=literal(start.isoformat())),
                LessThan(term=column, value=literal(end.isoformat())),
            )
        if isinstance(pf.transform, IdentityTransform) and isinstance(source.field_type, DateType):
            return EqualTo(term=Reference(source.name), value=literal(day.isoformat()))
    raise ConfigError(
        f"table {table.name()} is not partitioned by day (spec {spec}): a day overwrite needs "
        "a day(<timestamp>) or identity(<date>) partition field"
    )


def _data_files_of_days(table: Table, files_by_day: Mapping[date, Sequence[str]]) -> list[DataFile]:
    """Footer statistics of the new files, each checked to hold exactly its day (a file spanning
    two days, or of another day, would otherwise land outside the partition being replaced)."""
    owner = {path: day for day, paths in files_by_day.items() for path in paths}
    try:
        data_files = list(parquet_files_to_data_files(table.io, table.metadata, iter(owner)))
    except ValueError as e:  # pyiceberg refuses a file whose rows span several partitions
        days = ", ".join(str(d) for d in sorted(files_by_day))
        raise ConfigError(
            f"a file for day(s) {days} cannot be committed ({e}): every file of a day overwrite must "
            "contain exactly that day's rows"
        ) from e
    for df in data_files:
        day = owner[df.file_path]
        got = df.partition[0] if len(df.partition) else None
        if got != (day - _EPOCH).days:
            shown = (_EPOCH + timedelta(days=got)).isoformat() if isinstance(got, int) else got
            raise ConfigError(
                f"{df.file_path} holds day {shown}, not {day}: every file of a day overwrite must "
                "contain exactly that day's rows"
            )
    return data_files


def _day_runs(days: Sequence[date]) -> list[tuple[date, date]]:
    """Sorted days as runs of consecutive days: (first, last) pairs."""
    runs: list[tuple[date, date]] = []
    for d in sorted(set(days)):
        if runs and d == runs[-1][1] + timedelta(days=1):
            runs[-1] = (runs[-1][0], d)
        else:
            runs.append((d, d))
    return runs


def days_predicate(table: Table, days: Sequence[date]) -> BooleanExpression:
    """The rows of `days`: one range per run of consecutive days (`day_predicate` of each end)."""
    expr: BooleanExpression | None = None
    for first, last in _day_runs(days):
        lo, hi = day_predicate(table, first), day_predicate(table, last)
        part: BooleanExpression
        if first == last:
            part = lo
        elif isinstance(lo, And) and isinstance(hi, And):  # [start of first, end of last)
            part = And(lo.left, hi.right)
        else:  # an identity(date) partition: one equality per day
            part = lo
            for i in range(1, (last - first).days + 1):
                part = Or(part, day_predicate(table, first + timedelta(days=i)))
        expr = part if expr is None else Or(expr, part)
    if expr is None:
        raise ValueError("days_predicate needs at least one day")
    return expr


def _committed_files_of_days(table: Table, days: Sequence[date]) -> list[DataFile]:
    """The data files the current snapshot holds for `days` (one scan plan): whole files, since
    every file of a day-partitioned table holds one day (a file of another partition is refused)."""
    if table.current_snapshot() is None or not days:
        return []
    want = {(d - _EPOCH).days for d in days}
    files = [task.file for task in table.scan(row_filter=days_predicate(table, list(days))).plan_files()]
    for df in files:
        if not len(df.partition) or df.partition[0] not in want:
            raise ConfigError(
                f"{df.file_path} is in partition {df.partition} of {'.'.join(table.name())}, not one of the days "
                "being replaced: a day overwrite replaces whole files of the day's partition (was the table's "
                "partition spec changed?)"
            )
    return files


def _overwrite_transaction(table: Table, days: Sequence[date], data_files: list[DataFile], props: dict[str, str]) -> Any:
    """One transaction, one OVERWRITE snapshot: the days' committed files out, the new ones in.
    (A delete and an append would be two snapshots, and a reader pinned to the first between them
    would see the days missing.)"""
    old = _committed_files_of_days(table, days)
    tx = table.transaction()
    if data_files and tx.table_metadata.name_mapping() is None:
        # Files written by Spark/pyarrow carry no Iceberg field ids: readers map by name.
        tx.set_properties({TableProperties.DEFAULT_NAME_MAPPING: table.schema().name_mapping.model_dump_json()})
    if old or data_files:
        with tx.update_snapshot(snapshot_properties=props).overwrite() as overwrite:
            # the days' predicate is also the conflict filter: a concurrent writer of one of them fails our commit
            overwrite.delete_by_predicate(days_predicate(table, days))
            for data_file in old:
                overwrite.delete_data_file(data_file)
            for data_file in data_files:
                overwrite.append_data_file(data_file)
    return tx


def commit_days_overwrite(
    table: Table,
    files_by_day: Mapping[date, Sequence[str]],
    *,
    snapshot_properties: Mapping[str, str] | None = None,
    max_attempts: int = 5,
) -> int | None:
    """Replace each day of `files_by_day` in `table` by its Parquet files (a day with no files is
    emptied) in ONE catalog commit that makes ONE snapshot (operation `overwrite`: the days' old
    files out, the new ones in), and return the new current snapshot id (None when the table is
    still empty). A reader at any snapshot sees every one of these days old or every one new,
    never a mix and never a day missing; days not named are left as they are.

    Re-running with new files for the same days replaces the old ones, so a rerun is idempotent. A
    commit that loses to a concurrent writer (CommitFailedException, or ValidationException when
    the other run changed one of these days' files) is rebuilt and retried on the refreshed table:
    the last writer wins and a day never holds two runs' files. After `max_attempts` conflicts it
    raises `CommitConflict`.
    """
    props = {k: str(v) for k, v in (snapshot_properties or {}).items()}
    days = sorted(files_by_day)
    if not days:
        raise ValueError("commit_days_overwrite needs at least one day")
    what = str(days[0]) if len(days) == 1 else f"{len(days)} days {days[0]}..{days[-1]}"
    data_files = _data_files_of_days(table, files_by_day)
    for attempt in range(1, max_attempts + 1):
        tx = _overwrite_transaction(table, days, data_files, props)
        try:
            tx.commit_transaction()
        except (CommitFailedException, ValidationException) as e:
            # pyiceberg first retries by itself on the new base; when another run changed one of
            # these days meanwhile, its validation refuses (ValidationException). We then rebuild
            # the whole transaction on the refreshed table: our overwrite now covers their files too.
            if attempt == max_attempts:
                raise CommitConflict(
                    f"{'day' if len(days) == 1 else 'days'} {what} of {'.'.join(table.name())}: {attempt} commits lost "
                    f"to concurrent writers ({e}); re-run once the other run finished"
                ) from e
            wait = min(0.2 * 2**attempt, 5.0) * (0.5 + random.random())
            log.warning("commit of %s conflicted (attempt %d/%d): retrying on the new table state in %.1fs",
                        what, attempt, max_attempts, wait)
            time.sleep(wait)
            table.refresh()
            continue
        snap = table.current_snapshot()
        log.info("committed %s to %s: %d files, snapshot %s", what, ".".join(table.name()),
                 sum(len(f) for f in files_by_day.values()), snap.snapshot_id if snap else None)
        return snap.snapshot_id if snap else None
    raise AssertionError("unreachable")  # the loop returns or raises


def commit_day_overwrite(
    table: Table,
    day: date,
    files: Sequence[str],
    *,
    snapshot_properties: Mapping[str, str] | None = None,
    max_attempts: int = 5,
) -> int | None:
    """Replace `day` in `table` by the Parquet `files` in ONE catalog commit that makes ONE
    snapshot (`commit_days_overwrite` of one day): a reader at any snapshot sees the day whole, old
    or new, never missing, and a re-run of the day is idempotent."""
    return commit_days_overwrite(table, {day: list(files)}, snapshot_properties=snapshot_properties,
                                 max_attempts=max_attempts)

# --- S3 warehouse settings ---------------------------------------------------------------------
# The warehouse is on S3 when SLIPSTREAM_WAREHOUSE starts with s3:// (e.g. s3://warehouse/wh on the
# local SeaweedFS). Endpoint and keys are settings (SLIPSTREAM_S3_*: an Airflow Connection or a
# Secret in production; the settings file `slipstream stack up` writes for the local server), so
# nothing secret is ever in code or in the repository.


def warehouse_on_s3(settings: Settings) -> bool:
    return settings.warehouse.startswith(("s3://", "s3a://"))


def s3_io_properties(settings: Settings) -> dict[str, str]:
    """pyiceberg/pyarrow S3 FileIO properties of the settings (`Settings.s3_io_properties`)."""
    return settings.s3_io_properties()
