"""The Iceberg tables the quality team owns: `quality_results` and `sample_profiles`.

Both are small and keyed so that re-running a check replaces its rows (idempotent per data
interval): results by (run_id, scope), profiles by day.

Every write adds a data file and a manifest, and every keyed overwrite and filtered read opens all
of them, so a table written by each gate of every daily run would get slower run by run (a write
took 0.07 s on an empty table and 0.72 s after 300 gates). Once a table holds more than
`COMPACT_ABOVE_FILES` data files, the writer rewrites it as one file and expires the snapshots
older than `KEEP_SNAPSHOTS` (the rows carry the samples' snapshot id themselves; nothing reads
these tables at an old snapshot).
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, In, LessThan
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import BooleanType, DateType, LongType, NestedField, StringType, TimestamptzType

from slipstream.lake.iceberg import ensure_table
from slipstream.quality.profiles import FeatureProfile
from slipstream.quality.suites import CheckResult
from slipstream.samples.spec import LABEL

log = logging.getLogger(__name__)

RESULTS_TABLE = "quality_results"
PROFILES_TABLE = "sample_profiles"
COMPACT_ABOVE_FILES = 32
KEEP_SNAPSHOTS = timedelta(days=7)

RESULTS_SCHEMA = Schema(
    NestedField(1, "run_id", StringType(), required=False),
    NestedField(2, "scope", StringType(), required=False, doc="day:YYYY-MM-DD or window:START/END"),
    NestedField(3, "day", DateType(), required=False, doc="the checked day (null for a window)"),
    NestedField(4, "snapshot_id", LongType(), required=False),
    NestedField(5, "expectation", StringType(), required=False),
    NestedField(6, "severity", StringType(), required=False),
    NestedField(7, "success", BooleanType(), required=False),
    NestedField(8, "observed", StringType(), required=False),
    NestedField(9, "expected", StringType(), required=False),
    NestedField(10, "checked_at", TimestamptzType(), required=False),
)
RESULTS_ARROW = pa.schema(
    [
        ("run_id", pa.string()), ("scope", pa.string()), ("day", pa.date32()), ("snapshot_id", pa.int64()),
        ("expectation", pa.string()), ("severity", pa.string()), ("success", pa.bool_()),
        ("observed", pa.string()), ("expected", pa.string()), ("checked_at", pa.timestamp("us", tz="UTC")),
    ]
)

PROFILES_SCHEMA = Schema(
    NestedField(1, "day", DateType(), required=False),
    NestedField(2, "snapshot_id", LongType(), required=False),
    NestedField(3, "run_id", StringType(), required=False),
    NestedField(4, "rows", LongType(), required=False),
    NestedField(5, "profile", StringType(), required=False, doc="FeatureProfile.to_json()"),
    NestedField(6, "created_at", TimestamptzType(), required=False),
)
PROFILES_ARROW = pa.schema(
    [
        ("day", pa.date32()), ("snapshot_id", pa.int64()), ("run_id", pa.string()), ("rows", pa.int64()),
        ("profile", pa.string()), ("created_at", pa.timestamp("us", tz="UTC")),
    ]
)


def results_table(catalog: Catalog, namespace: str) -> Table:
    return ensure_table(catalog, f"{namespace}.{RESULTS_TABLE}", RESULTS_SCHEMA)


def profiles_table(catalog: Catalog, namespace: str) -> Table:
    return ensure_table(catalog, f"{namespace}.{PROFILES_TABLE}", PROFILES_SCHEMA)


def write_results(
    catalog: Catalog, namespace: str, *, run_id: str, scope: str, day: date | None, snapshot_id: int,
    results: Iterable[CheckResult],
) -> int:
    """Replace the rows of (run_id, scope) with these results. Returns the number written."""
    rs = list(results)
    now = datetime.now(UTC)
    tbl = pa.table(
        {
            "run_id": [run_id] * len(rs), "scope": [scope] * len(rs), "day": [day] * len(rs),
            "snapshot_id": [snapshot_id] * len(rs), "expectation": [r.name for r in rs],
            "severity": [r.severity for r in rs], "success": [r.success for r in rs],
            "observed": [r.observed for r in rs], "expected": [r.expected for r in rs],
            "checked_at": [now] * len(rs),
        },
        schema=RESULTS_ARROW,
    )
    table = results_table(catalog, namespace)
    with _quiet_first_write():
        run_scope = And(EqualTo("run_id", run_id), EqualTo("scope", scope))  # type: ignore[call-arg, arg-type]  # mypy types pyiceberg's predicates by their pydantic fields, not __init__
        table.overwrite(tbl, overwrite_filter=run_scope)
    compact(table)
    return len(rs)


def write_profile(
    catalog: Catalog, namespace: str, *, day: date, snapshot_id: int, run_id: str, profile: FeatureProfile
) -> None:
    """Replace the stored profile of `day`."""
    write_profiles(catalog, namespace, {day: profile}, snapshot_id=snapshot_id, run_id=run_id)


def write_profiles(
    catalog: Catalog, namespace: str, profiles: Mapping[date, FeatureProfile], *, snapshot_id: int, run_id: str
) -> int:
    """Replace the stored profiles of these days in ONE commit (a backfill's 200 days are one
    table write, not 200). Returns the number written."""
    if not profiles:
        return 0
    days = sorted(profiles)
    now = datetime.now(UTC)
    tbl = pa.table(
        {
            "day": days, "snapshot_id": [snapshot_id] * len(days), "run_id": [run_id] * len(days),
            "rows": [profiles[d].rows for d in days], "profile": [profiles[d].to_json() for d in days],
            "created_at": [now] * len(days),
        },
        schema=PROFILES_ARROW,
    )
    table = profiles_table(catalog, namespace)
    with _quiet_first_write():
        the_days = In("day", [d.isoformat() for d in days])  # type: ignore[call-arg, arg-type]  # mypy types pyiceberg's predicates by their pydantic fields, not __init__
        table.overwrite(tbl, overwrite_filter=the_days)
    compact(table)
    return len(days)


def compact(table: Table) -> bool:
    """Rewrite a small table as one data file once it holds more than COMPACT_ABOVE_FILES, and
    expire its snapshots older than KEEP_SNAPSHOTS. Returns whether it rewrote. A concurrent
    writer wins: its commit makes this one fail, and the next write compacts."""
    snap = table.current_snapshot()
    if snap is None or snap.summary is None:
        return False
    files = int(snap.summary.additional_properties.get("total-data-files", "0"))
    if files <= COMPACT_ABOVE_FILES:
        return False
    try:
        rows = table.scan(snapshot_id=snap.snapshot_id).to_arrow()
        table.overwrite(rows)
        cutoff = datetime.now(UTC) - KEEP_SNAPSHOTS
        current = table.current_snapshot()
        old = [s.snapshot_id for s in table.snapshots()
               if current is None or s.snapshot_id != current.snapshot_id
               if datetime.fromtimestamp(s.timestamp_ms / 1000, UTC) < cutoff]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
    except CommitFailedException as e:
        log.info("compacting %s skipped, another writer committed first (%s)", ".".join(table.name()), e)
        return False
    log.info("compacted %s: %d data files -> 1 (%d rows)", ".".join(table.name()), files, rows.num_rows)
    return True


@contextmanager
def _quiet_first_write() -> Iterator[None]:
    """pyiceberg warns when an overwrite's delete matches nothing: the normal first write of a key."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Delete operation did not match any records")
        yield


def read_profiles(catalog: Catalog, namespace: str, start: date, end: date) -> dict[date, FeatureProfile]:
    """Stored profiles of the days in [start, end), by day."""
    return {d: FeatureProfile.from_dict(doc) for d, doc in read_profile_docs(catalog, namespace, start, end).items()}


def stored_profile_days(catalog: Catalog, namespace: str, start: date, end: date) -> set[date]:
    """The days in [start, end) that have a stored profile (their documents are not read)."""
    table = profiles_table(catalog, namespace)
    in_range = And(GreaterThanOrEqual("day", start.isoformat()), LessThan("day", end.isoformat()))  # type: ignore[call-arg, arg-type]  # mypy types pyiceberg's predicates by their pydantic fields, not __init__
    return set(table.scan(row_filter=in_range, selected_fields=("day",)).to_arrow().column("day").to_pylist())


def read_profile_docs(catalog: Catalog, namespace: str, start: date, end: date) -> dict[date, dict[str, Any]]:
    """Stored profiles of the days in [start, end) as their JSON documents, by day: what a caller
    that needs a number or two of each day (`label_rate`) reads without building every sketch."""
    table = profiles_table(catalog, namespace)
    in_range = And(GreaterThanOrEqual("day", start.isoformat()), LessThan("day", end.isoformat()))  # type: ignore[call-arg, arg-type]  # mypy types pyiceberg's predicates by their pydantic fields, not __init__
    rows = table.scan(row_filter=in_range, selected_fields=("day", "profile")).to_arrow()
    out = {d: json.loads(text) for d, text in zip(rows.column("day").to_pylist(), rows.column("profile").to_pylist())}
    return dict(sorted(out.items()))


def label_rate(doc: dict[str, Any]) -> float:
    """The label rate (CTR) of a stored profile document; NaN without labelled rows."""
    lab = doc.get("columns", {}).get(LABEL)
    return float(lab["mean"]) if lab and lab.get("count") else float("nan")


def read_results(catalog: Catalog, namespace: str, run_id: str | None = None) -> pa.Table:
    table = results_table(catalog, namespace)
    if run_id is None:
        return table.scan().to_arrow()
    return table.scan(row_filter=EqualTo("run_id", run_id)).to_arrow()  # type: ignore[call-arg, arg-type]  # mypy types pyiceberg's predicates by their pydantic fields, not __init__
