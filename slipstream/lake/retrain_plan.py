"""Which days a retraining run must (re)preprocess before it can train on its window.

A daily run owns its data interval's day D and always rebuilds it (re-running D replaces D). The
training window is the `window_days` days ending at the interval's end; any of those days that the
`samples` table does not hold yet (a fresh deployment, a day that failed earlier) is built in the
same preprocessing call, so a run never trains on a window with holes.
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from slipstream.lake.planning import window_bounds

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

DAY_PARTITION_FIELD = "event_time_day"


def window_days(end: datetime, n_days: int) -> list[date]:
    """The UTC days of the window [end - n_days, end) (`planning.window_bounds`), oldest first.
    `end` is a day boundary."""
    _, end = window_bounds(end, n_days)
    last = (end - timedelta(microseconds=1)).date()
    return [last - timedelta(days=i) for i in reversed(range(n_days))]


def days_present(table: Table) -> set[date]:
    """Days with at least one row in the table's current snapshot (from partition metadata only)."""
    if table.current_snapshot() is None:
        return set()
    parts = table.inspect.partitions()
    days: set[date] = set()
    for part, rows in zip(parts.column("partition").to_pylist(), parts.column("record_count").to_pylist()):
        day = (part or {}).get(DAY_PARTITION_FIELD)
        if day is not None and rows > 0:
            days.add(day)
    return days


def days_to_preprocess(interval_day: date, window: list[date], present: set[date]) -> list[date]:
    """The interval's day plus every window day missing from the table, oldest first, no repeats."""
    todo = {interval_day} | {d for d in window if d not in present}
    return sorted(todo)


def plan_days(table: Table | None, interval_start: datetime, interval_end: datetime, n_days: int) -> list[date]:
    """Days to preprocess for a run whose data interval is [interval_start, interval_end)."""
    window = window_days(interval_end, n_days)
    present = days_present(table) if table is not None else set()
    todo = days_to_preprocess(interval_start.astimezone(UTC).date(), window, present)
    missing = [d for d in todo if d not in present]
    log.info(
        "window %s..%s: %d of %d days in the table; preprocessing %s",
        window[0], window[-1], len([d for d in window if d in present]), len(window),
        ", ".join(map(str, todo)) + (f" ({len(missing)} missing)" if missing else ""),
    )
    return todo
