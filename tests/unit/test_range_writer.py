"""The range writer's task function (plain Arrow, no Spark): a task's rows sorted by day become
one file per day, each holding exactly that day, with each day's input rows counted; and how a
long range is cut into passes."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from spark_jobs.range_job import plan_passes
from spark_jobs.writer import Split, _task_writer

D0 = date(2026, 5, 1)
SCHEMA = pa.schema([("event_time", pa.timestamp("us", tz="UTC")), ("x", pa.int64())])


def _batch(day: date, n: int, start: int) -> pa.RecordBatch:
    t0 = datetime(day.year, day.month, day.day, tzinfo=UTC)
    times = [t0 + timedelta(minutes=i) for i in range(n)]
    return pa.RecordBatch.from_pydict({"event_time": times, "x": list(range(start, start + n)),
                                       "_day": pa.array([day] * n, pa.date32())})


def _drop_odd(batches):  # type: ignore[no-untyped-def]
    """A stand-in for the finisher: drops rows (as its dedupe does) and the day column."""
    for b in batches:
        keep = pa.compute.equal(pa.compute.bit_wise_and(b.column("x"), 1), 0)
        yield b.filter(keep).drop_columns(["_day"])


def test_each_day_gets_its_own_files_and_its_input_count(tmp_path: Path) -> None:
    split = Split("event_time_day", output_time="event_time", input_day="_day")
    write = _task_writer(str(tmp_path), "t", {}, SCHEMA, 64 << 20, lambda: _drop_odd, split)
    d1, d2 = D0, D0 + timedelta(days=1)
    # day 1 spans two batches, and day 2 starts inside the second one
    b2 = pa.concat_batches([_batch(d1, 3, 10), _batch(d2, 5, 20)])
    out = pa.Table.from_batches(list(write(iter([_batch(d1, 4, 0), b2])))).to_pylist()
    files = [r for r in out if r["path"]]
    assert sorted((r["part"], r["rows"]) for r in files) == [(str(d1), 4), (str(d2), 3)]
    assert sorted((r["part"], r["inputs"]) for r in out if not r["path"]) == [(str(d1), 7), (str(d2), 5)]
    for r in files:
        assert f"/event_time_day={r['part']}/" in r["path"]
        days = {t.date() for t in pq.read_table(r["path"]).column("event_time").to_pylist()}
        assert days == {date.fromisoformat(r["part"])}


def test_a_long_range_runs_in_passes_of_consecutive_days() -> None:
    days = [D0 + timedelta(days=i) for i in range(6)]
    sizes = {d: 10 for d in days} | {days[3]: 100}
    assert plan_passes(days, sizes, max_bytes=25) == [days[0:2], days[2:3], days[3:4], days[4:6]]
    assert plan_passes(days, sizes, max_bytes=1000) == [days]
