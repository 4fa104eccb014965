"""Snapshot pinning, the training window, and the file plan of a window at a snapshot.

A training run never reads "the latest": the render step pins a snapshot id once, computes the
window with `window_bounds` (the one place a window [T − W, T) is computed) and plans its files
once (`slipstream.pipeline.runplan` records them); every stage reads that plan.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from slipstream.errors import ConfigError

if TYPE_CHECKING:  # pyiceberg is imported where a table is scanned: the DAG files import this module
    from pyiceberg.table import Table

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WindowFile:
    path: str
    size_bytes: int
    record_count: int
    delete_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class WindowPlan:
    table: str
    snapshot_id: int
    start: datetime
    end: datetime
    files: tuple[WindowFile, ...]

    @property
    def rows(self) -> int:
        return sum(f.record_count for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


def pin_snapshot(table: Table, snapshot_id: int | None = None) -> int:
    """The given snapshot id, checked to exist, or the current one when None (at pin time only)."""
    if snapshot_id is None:
        snap = table.current_snapshot()
        if snap is None:
            raise ConfigError(f"table {table.name()} has no snapshot yet: preprocess a day first")
        return snap.snapshot_id
    if table.snapshot_by_id(snapshot_id) is None:
        raise ConfigError(
            f"snapshot {snapshot_id} does not exist in {'.'.join(table.name())} "
            "(expired, or from another table): pin a current one"
        )
    return snapshot_id


def window_bounds(end: datetime, window_days: int) -> tuple[datetime, datetime]:
    if window_days < 1:
        raise ConfigError(f"window_days must be >= 1, got {window_days}")
    if end.tzinfo is None:
        raise ConfigError(f"window end must be timezone-aware (UTC), got {end.isoformat()}")
    # a plain datetime: pendulum's DateTime (Airflow's data intervals) drops a stdlib tzinfo on
    # subtraction, which would hand a naive start to the gate and the planner
    end = datetime.fromtimestamp(end.timestamp(), tz=UTC)
    return end - timedelta(days=window_days), end


def plan_window_files(table: Table, snapshot_id: int, start: datetime, end: datetime) -> WindowPlan:
    """Data files at `snapshot_id` that may hold rows with start <= event_time < end."""
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan, Reference
    from pyiceberg.expressions.literals import literal

    # keywords: pydantic's typing of these models knows their fields, not pyiceberg's positional __init__
    event_time = Reference("event_time")
    scan = table.scan(
        row_filter=And(
            GreaterThanOrEqual(term=event_time, value=literal(start.isoformat())),
            LessThan(term=event_time, value=literal(end.isoformat())),
        ),
        snapshot_id=snapshot_id,
    )
    files = tuple(
        WindowFile(
            path=task.file.file_path,
            size_bytes=task.file.file_size_in_bytes,
            record_count=task.file.record_count,
            delete_files=tuple(d.file_path for d in task.delete_files),
        )
        for task in scan.plan_files()
    )
    plan = WindowPlan(".".join(table.name()), snapshot_id, start, end, tuple(sorted(files, key=lambda f: f.path)))
    log.info(
        "planned %d files (%d rows, %.1f MB) for [%s, %s) at snapshot %s",
        len(plan.files), plan.rows, plan.bytes / 1e6, start.isoformat(), end.isoformat(), snapshot_id,
    )
    return plan
