"""Columnar reads of `samples` at a pinned snapshot, and per-day row counts from metadata."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.table import DataScan, Table

from slipstream.errors import ConfigError
from slipstream.lake.planning import WindowFile
from slipstream.samples.schema import SAMPLES_TABLE

log = logging.getLogger(__name__)
EPOCH = date(1970, 1, 1)


def load_samples(catalog: Catalog, namespace: str) -> Table:
    try:
        return catalog.load_table(f"{namespace}.{SAMPLES_TABLE}")
    except NoSuchTableError:
        raise ConfigError(
            f"Iceberg table {namespace}.{SAMPLES_TABLE} does not exist: preprocess a day first "
            "(`slipstream generate` then the preprocess job)"
        ) from None


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return start, start + timedelta(days=1)


def _interval_scan(table: Table, snapshot_id: int, start: datetime, end: datetime, columns: tuple[str, ...]) -> DataScan:
    in_interval = And(
        GreaterThanOrEqual("event_time", start.isoformat()),  # type: ignore[call-arg, arg-type]  # mypy types pyiceberg's predicates by their pydantic fields, not __init__
        LessThan("event_time", end.isoformat()),  # type: ignore[call-arg, arg-type]  # mypy types pyiceberg's predicates by their pydantic fields, not __init__
    )
    return table.scan(
        row_filter=in_interval,
        snapshot_id=snapshot_id,
        selected_fields=columns,
    )


def read_interval(
    table: Table, snapshot_id: int, start: datetime, end: datetime, columns: tuple[str, ...] | None = None,
    files: Sequence[WindowFile] | None = None, absent: dict[str, int] | None = None,
) -> pa.Table:
    """All rows of the data files of [start, end) at the snapshot, unfiltered; `columns` (default:
    the table's) in that order.

    The files are planned by Iceberg (partition and column-statistics pruning), or given by the
    run's plan (`files`), and read whole with pyarrow, so a row that sits in the day's files but
    has an event time outside the day is seen by the gate instead of silently filtered away.
    A column a file lacks (written before the spec had the feature) reads as nulls; `absent`, when
    given, gets the number of such rows per column. Tables with delete files fall back to
    pyiceberg's filtered scan, which applies them.
    """
    t0 = time.monotonic()
    columns = columns if columns is not None else tuple(f.name for f in table.schema().fields)
    scan = _interval_scan(table, snapshot_id, start, end, columns)
    if files is None:
        tasks = list(scan.plan_files())
        paths, deletes = [t.file.file_path for t in tasks], any(t.delete_files for t in tasks)
    else:
        paths, deletes = [f.path for f in files], any(f.delete_files for f in files)
    if deletes:
        log.info("delete files present: reading through pyiceberg's scan")
        return scan.to_arrow()
    parts = []
    for path in paths:
        with table.io.new_input(path).open() as f:
            try:
                parts.append(pq.read_table(f, columns=list(columns)))
                continue
            except pa.ArrowInvalid:
                f.seek(0)  # a column is missing from this file: read what it has
                part = pq.ParquetFile(f).read()
        parts.append(_with_columns(table, part, columns, absent))
    if not parts:
        log.warning("no data files for [%s, %s) at snapshot %s", start.isoformat(), end.isoformat(), snapshot_id)
        return scan.to_arrow()  # empty, with the table's schema
    out = pa.concat_tables(parts, promote_options="permissive")
    seconds = time.monotonic() - t0
    log.info(
        "read %d rows from %d files of [%s, %s) at snapshot %s in %.2fs (%.0f rows/s)",
        out.num_rows, len(paths), start.isoformat(), end.isoformat(), snapshot_id, seconds,
        out.num_rows / max(seconds, 1e-9),
    )
    return out


def _with_columns(table: Table, part: pa.Table, columns: tuple[str, ...], absent: dict[str, int] | None) -> pa.Table:
    """`part` with `columns` in order, a column it lacks as nulls of the table's type."""
    types = {f.name: _plain(f.type) for f in schema_to_pyarrow(table.schema(), include_field_ids=False)}
    for c in columns:
        if c not in part.column_names:
            part = part.append_column(pa.field(c, types[c]), pa.nulls(part.num_rows, types[c]))
            if absent is not None:
                absent[c] = absent.get(c, 0) + part.num_rows
    return part.select(list(columns))


def _plain(t: pa.DataType) -> pa.DataType:
    """pyiceberg's Arrow types use 64-bit offsets; data files written by Spark and pyarrow do not."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_list(t):
        return pa.list_(_plain(t.value_type))
    return t


def day_row_counts(table: Table, snapshot_id: int, start: datetime, end: datetime) -> dict[date, int]:
    """Rows per day partition in [start, end) from the manifests alone (no data file is read)."""
    counts: dict[date, int] = defaultdict(int)
    for t in _interval_scan(table, snapshot_id, start, end, ("event_time",)).plan_files():
        value = t.file.partition[0]
        if value is None:
            continue
        counts[EPOCH + timedelta(days=int(value))] += t.file.record_count
    return {
        d: n for d, n in sorted(counts.items())
        if start.date() <= d and datetime(d.year, d.month, d.day, tzinfo=UTC) < end
    }
