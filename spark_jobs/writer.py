"""Executors write Parquet files for one day or a range of days; the driver only learns their paths.

Each Spark task streams its rows (as Arrow batches, through `mapInArrow`) into Parquet files it
opens through pyiceberg's FileIO, so the same code writes to a local warehouse or to S3 with the
catalog's own credentials, without Hadoop S3 jars. A file is closed once it reaches the target
size. Rows are cast to the table's Arrow schema, so column types match the Iceberg table exactly
(which `add_files` requires). Only the small list of written paths comes back to the driver.

A range of days is written in one job (`split`): each task's rows arrive sorted by day, and a
task closes its file whenever the day changes, so every file holds exactly one day (an Iceberg
day partition) under `<directory>/<column>=<day>/`. The tasks also count the rows each day had
before `prepare` (the writer's dedupe may drop copies): the raw records per day.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

log = logging.getLogger(__name__)
EPOCH = date(1970, 1, 1)
US_PER_DAY = 86_400_000_000

ROW_GROUP_ROWS = 256 * 1024
_RESULT_SCHEMA = pa.schema([("path", pa.string()), ("part", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64()),
                            ("inputs", pa.int64())])
_RESULT_DDL = "path string, part string, rows long, bytes long, inputs long"


@dataclass(frozen=True)
class WrittenFiles:
    paths: list[str]
    rows: int
    bytes: int


@dataclass(frozen=True)
class Split:
    """How a range write splits its rows into one folder per day (see the module docstring)."""

    folder: str
    """The folder name's prefix: `<directory>/<folder>=<day>/`."""
    output_time: str = ""
    """The output's timestamp column whose UTC day is the row's day; empty: `output_day`."""
    output_day: str = ""
    """The output's date column that is the row's day (when there is no timestamp to derive it from)."""
    input_day: str = ""
    """The input's date column counted per day before `prepare` (empty: nothing counted)."""


@dataclass(frozen=True)
class WrittenDays:
    """What a range write produced, per day (ISO date strings)."""

    paths: dict[str, list[str]]
    rows: dict[str, int]
    inputs: dict[str, int]
    """Input rows per day, counted before `prepare` (when the split names an `input_day`)."""
    bytes: int

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    @property
    def all_paths(self) -> list[str]:
        return sorted(p for ps in self.paths.values() for p in ps)


BatchStream = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def _day_keys(batch: pa.RecordBatch, split: Split) -> np.ndarray:
    """Days since the epoch of each output row (int64)."""
    if split.output_time:
        us: np.ndarray = pc.cast(batch.column(split.output_time), pa.int64()).to_numpy(zero_copy_only=False)
        return us // US_PER_DAY
    days: np.ndarray = pc.cast(batch.column(split.output_day), pa.int32()).to_numpy(zero_copy_only=False)
    return days.astype(np.int64)


def _day_runs(batch: pa.RecordBatch, split: Split | None) -> Iterator[tuple[int | None, pa.RecordBatch]]:
    """The batch cut where the day changes: (day since the epoch, rows) runs, in order."""
    if split is None or batch.num_rows == 0:
        yield None, batch
        return
    days = _day_keys(batch, split)
    cuts = np.flatnonzero(days[1:] != days[:-1]) + 1
    bounds = [0, *cuts.tolist(), batch.num_rows]
    for a, b in zip(bounds[:-1], bounds[1:]):
        yield int(days[a]), batch.slice(a, b - a)


def _counted(batches: Iterator[pa.RecordBatch], column: str, counts: Counter[int]) -> Iterator[pa.RecordBatch]:
    """Pass the batches on, counting their rows per value of the date column `column`."""
    for batch in batches:
        if batch.num_rows:
            days = pc.cast(batch.column(column), pa.int32()).to_numpy(zero_copy_only=False)
            values, n = np.unique(days, return_counts=True)
            for v, c in zip(values.tolist(), n.tolist()):
                counts[int(v)] += int(c)
        yield batch


def _task_writer(
    directory: str, prefix: str, io_properties: dict[str, str], schema: pa.Schema, target_bytes: int,
    prepare: Callable[[], BatchStream] | None, split: Split | None = None,
) -> BatchStream:
    """The function each task runs: batches in, one row per written file out (and, with a split
    that counts inputs, one row per day with its input rows). `prepare` makes a fresh per-task
    step that turns the task's batches into rows of `schema`."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq
        from pyiceberg.io.pyarrow import PyArrowFileIO
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}" if ctx else "00000-0"
        io = PyArrowFileIO(io_properties)
        done: list[tuple[str, str, int, int]] = []
        state: dict[str, Any] = {"stream": None, "writer": None, "path": "", "rows": 0, "part": None}
        buffered: list[pa.RecordBatch] = []
        buffered_rows = buffered_bytes = 0
        inputs: Counter[int] = Counter()

        def part_name(day: int | None) -> str:
            return "" if day is None else (EPOCH + timedelta(days=day)).isoformat()

        def close_file() -> None:
            if state["writer"] is not None:
                state["writer"].close()
                size = state["stream"].tell()
                state["stream"].close()
                done.append((state["path"], part_name(state["part"]), state["rows"], size))
                state.update(stream=None, writer=None, rows=0)

        def flush(day: int | None) -> None:
            nonlocal buffered, buffered_rows, buffered_bytes
            if not buffered_rows:
                return
            if state["writer"] is None:
                folder = directory if split is None else f"{directory}/{split.folder}={part_name(day)}"
                state["path"] = f"{folder}/{prefix}-{task}-{len(done):03d}.parquet"
                state["stream"] = io.new_output(state["path"]).create(overwrite=True)
                state["writer"] = pq.ParquetWriter(state["stream"], schema, compression="zstd")
                state["part"] = day
            table = pa.Table.from_batches(buffered).select(schema.names).cast(schema)
            state["writer"].write_table(table, row_group_size=len(table))
            state["rows"] += len(table)
            buffered, buffered_rows, buffered_bytes = [], 0, 0
            if state["stream"].tell() >= target_bytes:
                close_file()

        source = batches if split is None or not split.input_day else _counted(batches, split.input_day, inputs)
        current: int | None = None
        for batch in prepare()(source) if prepare is not None else source:
            for day, rows in _day_runs(batch, split):
                if day != current:
                    flush(current)
                    close_file()  # a file holds one day
                    current = day
                buffered.append(rows)
                buffered_rows += rows.num_rows
                buffered_bytes += rows.nbytes
                # In-memory Arrow is larger than compressed Parquet, so bounding the row group by the
                # target keeps files from overshooting it by more than one row group.
                if buffered_rows >= ROW_GROUP_ROWS or buffered_bytes >= target_bytes:
                    flush(current)
        flush(current)
        close_file()
        out = [{"path": p, "part": d, "rows": r, "bytes": b, "inputs": 0} for p, d, r, b in done]
        out += [{"path": "", "part": part_name(d), "rows": 0, "bytes": 0, "inputs": n} for d, n in sorted(inputs.items())]
        yield pa.RecordBatch.from_pylist(out, schema=_RESULT_SCHEMA)

    return write


def write_parquet_files(
    df: DataFrame,
    *,
    directory: str,
    run_tag: str,
    io_properties: dict[str, str],
    schema: pa.Schema,
    target_bytes: int,
    prepare: Callable[[], BatchStream] | None = None,
    columns: list[str] | None = None,
) -> WrittenFiles:
    """Write `df` (columns of `schema`) as Parquet files under `directory`; return what was written.

    With `prepare`, each task streams its batches (of `columns`, default the schema's) through a
    fresh `prepare()` first, which must yield the columns of `schema`; it sees the task's rows in
    the partition's order.

    File names carry `run_tag`, a fresh id per call, the task and attempt, so a rerun or a retried
    task never overwrites a file a committed snapshot references.
    """
    prefix = f"{run_tag}-{uuid.uuid4().hex[:8]}"
    fn = _task_writer(directory.rstrip("/"), prefix, io_properties, schema, target_bytes, prepare)
    rows = df.select(*(columns or schema.names)).mapInArrow(fn, _RESULT_DDL).collect()
    written = WrittenFiles(
        paths=sorted(r["path"] for r in rows), rows=sum(r["rows"] for r in rows), bytes=sum(r["bytes"] for r in rows)
    )
    log.info("wrote %d rows in %d files (%.1f MB) under %s", written.rows, len(written.paths), written.bytes / 1e6, directory)
    return written


def write_day_files(
    df: DataFrame,
    *,
    directory: str,
    split: Split,
    run_tag: str,
    io_properties: dict[str, str],
    schema: pa.Schema,
    target_bytes: int,
    prepare: Callable[[], BatchStream] | None = None,
    columns: list[str] | None = None,
) -> WrittenDays:
    """`write_parquet_files` for a range of days: every file holds one day, under
    `<directory>/<split.folder>=<day>/`. Each task's rows must arrive sorted by day (else a day
    gets more files, each still of one day). Returns the files and rows per day."""
    prefix = f"{run_tag}-{uuid.uuid4().hex[:8]}"
    fn = _task_writer(directory.rstrip("/"), prefix, io_properties, schema, target_bytes, prepare, split)
    rows = df.select(*(columns or schema.names)).mapInArrow(fn, _RESULT_DDL).collect()
    paths: dict[str, list[str]] = {}
    counts: dict[str, int] = {}
    inputs: dict[str, int] = {}
    total_bytes = 0
    for r in rows:
        if r["path"]:
            paths.setdefault(r["part"], []).append(r["path"])
            counts[r["part"]] = counts.get(r["part"], 0) + int(r["rows"])
            total_bytes += int(r["bytes"])
        else:
            inputs[r["part"]] = inputs.get(r["part"], 0) + int(r["inputs"])
    written = WrittenDays({d: sorted(p) for d, p in sorted(paths.items())}, dict(sorted(counts.items())),
                          dict(sorted(inputs.items())), total_bytes)
    log.info("wrote %d rows of %d days in %d files (%.1f MB) under %s", written.total_rows, len(paths),
             len(written.all_paths), total_bytes / 1e6, directory)
    return written
