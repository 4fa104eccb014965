"""A sample id is unique across the whole `samples` table, not only within its day.

The preprocessing job dedupes a day's events by id, but the same ids can arrive again on another
day: a log replayed under a later date, a generator run twice with the same seed, an export that
overlaps the last one. Two rows with one id would be trained twice, and the evaluation holdout
(a function of the id) would mix them. So before a day is committed, its new ids are looked up in
every other day of the table at the current snapshot; any found refuses the commit, naming the
days and how many ids each already holds.

Cost: the `sample_id` column of the other days is read (one column, file by file, on a few
threads), minus the files whose id bounds in the Iceberg manifest cannot hold a new id (ids that
grow with time skip almost everything). An id rule that includes the event time (`{hash: [...,
ts]}`, `{hash: ["*"]}`) cannot repeat on another day, so the check is skipped for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slipstream.errors import DuplicateSampleIds
from slipstream.samples.spec import SAMPLE_ID, Spec

if TYPE_CHECKING:
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

EPOCH = date(1970, 1, 1)
EXAMPLES = 5
READ_THREADS = 4


def ids_can_repeat_across_days(spec: Spec) -> bool:
    """False when the sample id hashes fields that include the event time (a record of another
    day has another id); True for an id field or a hash without the time."""
    rule = spec.events.id
    if isinstance(rule, str):
        return True
    return not (rule == ("*",) or (spec.events.time in (rule or ())))


@dataclass
class Collisions:
    """New ids of the days being committed that some other day already holds."""

    days: dict[date, int] = field(default_factory=dict)
    """Other day -> how many of the new ids it holds."""
    examples: list[str] = field(default_factory=list)
    files_read: int = 0
    files_skipped: int = 0

    @property
    def total(self) -> int:
        return sum(self.days.values())


def _bounds(df: object, field_id: int) -> tuple[bytes | None, bytes | None]:
    """The data file's lower and upper bound of `sample_id` (UTF-8; the upper one rounded up when
    truncated), from the manifest."""
    lower = getattr(df, "lower_bounds", None) or {}
    upper = getattr(df, "upper_bounds", None) or {}
    return lower.get(field_id), upper.get(field_id)


def find_collisions(table: Table, new_ids: Mapping[date, pa.Array | pa.ChunkedArray]) -> Collisions:
    """Where the ids of `new_ids` (day -> the ids about to be committed for it) already exist in
    the table's other days (and in each other, when several days are committed together)."""
    out = Collisions()
    replaced = set(new_ids)
    days = sorted(new_ids)
    arrays = [new_ids[d].combine_chunks() if isinstance(new_ids[d], pa.ChunkedArray) else new_ids[d] for d in days]
    for i in range(len(days)):  # days committed together must not share ids either
        for other, ids in zip(days[i + 1:], arrays[i + 1:]):
            n = int(pc.sum(pc.is_in(ids, value_set=arrays[i])).as_py() or 0)
            if n:
                out.days[other] = out.days.get(other, 0) + n
                out.examples += ids.filter(pc.is_in(ids, value_set=arrays[i])).slice(0, EXAMPLES).to_pylist()
    if table.current_snapshot() is None or not arrays:
        return out
    value_set = pa.concat_arrays([a.cast(pa.string()) for a in arrays]) if len(arrays) > 1 else arrays[0].cast(pa.string())
    if not len(value_set):
        return out
    lo, hi = pc.min_max(value_set).values()
    lo_b, hi_b = lo.as_py().encode(), hi.as_py().encode()
    todo = []
    field_id = table.schema().find_field(SAMPLE_ID).field_id
    for task in table.scan(selected_fields=(SAMPLE_ID,)).plan_files():
        part = task.file.partition[0] if len(task.file.partition) else None
        day = EPOCH + timedelta(days=part) if isinstance(part, int) else None
        if day in replaced:
            continue
        f_lo, f_hi = _bounds(task.file, field_id)
        if f_lo is not None and f_hi is not None and (f_hi < lo_b or f_lo > hi_b):
            out.files_skipped += 1
            continue
        todo.append((day, task.file.file_path))

    def look(item: tuple[date | None, str]) -> tuple[date | None, int, list[str]]:
        day, path = item
        with table.io.new_input(path).open() as fh:
            ids = pq.read_table(fh, columns=[SAMPLE_ID]).column(SAMPLE_ID).combine_chunks()
        hit = pc.is_in(ids.cast(pa.string()), value_set=value_set)
        n = int(pc.sum(hit).as_py() or 0)
        return day, n, ids.filter(hit).slice(0, EXAMPLES).to_pylist() if n else []

    with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="unique-ids") as pool:
        for day, n, examples in pool.map(look, todo):
            out.files_read += 1
            if n and day is not None:
                out.days[day] = out.days.get(day, 0) + n
                out.examples += examples
    out.examples = list(dict.fromkeys(out.examples))[:EXAMPLES]
    return out


def check_unique_ids(table: Table, spec: Spec, new_ids: Mapping[date, pa.Array | pa.ChunkedArray]) -> Collisions | None:
    """Refuse (`DuplicateSampleIds`) the days of `new_ids` when some of their ids already exist in
    other days of the table; None when the spec's ids cannot repeat across days (not checked)."""
    if not ids_can_repeat_across_days(spec):
        log.debug("sample ids of spec %s hash the event time: they cannot repeat across days", spec.name)
        return None
    t0 = time.monotonic()
    found = find_collisions(table, new_ids)
    n_new = sum(len(v) for v in new_ids.values())
    log.info("sample-id uniqueness of %s against the table: %d files read, %d skipped by their id bounds, %.1fs",
             ", ".join(map(str, sorted(new_ids))), found.files_read, found.files_skipped, time.monotonic() - t0)
    if found.total:
        raise DuplicateSampleIds(describe(table, spec, sorted(new_ids), n_new, found))
    return found


def describe(table: Table, spec: Spec, days: Iterable[date], n_new: int, found: Collisions) -> str:
    where = ", ".join(f"{d} ({n:,})" for d, n in sorted(found.days.items()))
    rule = spec.events.id
    why = (f"the events' id field `{rule}` repeats across days" if isinstance(rule, str)
           else f"the id hashes {', '.join(rule or ())}, which repeat across days")
    return (f"day {', '.join(map(str, days))}: {found.total:,} of its {n_new:,} sample ids already exist in other days of "
            f"{'.'.join(table.name())}: {where}; e.g. {', '.join(found.examples)}. Nothing was committed (`samples` is "
            f"unchanged). A sample id must be unique across the table and {why}: fix the ids in the raw data, or hash "
            "fields that include the time (`id: {hash: [..., <time field>]}`), or rebuild the other days if they hold "
            "stale copies of these records")
