"""Executors write Parquet files for one day; the driver only learns their paths.

Each Spark task streams its rows (as Arrow batches, through `mapInArrow`) into Parquet files it
opens through pyiceberg's FileIO, so the same code writes to a local warehouse or to S3 with the
catalog's own credentials, without Hadoop S3 jars. A file is closed once it reaches the target
size. Rows are cast to the table's Arrow schema, so column types match the Iceberg table exactly
(which `add_files` requires). Only the small list of written paths comes back to the driver.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

ROW_GROUP_ROWS = 256 * 1024
_RESULT_SCHEMA = pa.schema([("path", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64())])


@dataclass(frozen=True)
class WrittenFiles:
    paths: list[str]
    rows: int
    bytes: int


BatchStream = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def _task_writer(
    directory: str, prefix: str, io_properties: dict[str, str], schema: pa.Schema, target_bytes: int,
    prepare: Callable[[], BatchStream] | None,
) -> BatchStream:
    """The function each task runs: batches in, one row per written file out. `prepare` makes a
    fresh per-task step that turns the task's batches into rows of `schema`."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq
        from pyiceberg.io.pyarrow import PyArrowFileIO
        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}" if ctx else "00000-0"
        io = PyArrowFileIO(io_properties)
        done: list[tuple[str, int, int]] = []
        state: dict = {"stream": None, "writer": None, "path": "", "rows": 0}
        buffered: list[pa.RecordBatch] = []
        buffered_rows = buffered_bytes = 0

        def close_file() -> None:
            if state["writer"] is not None:
                state["writer"].close()
                size = state["stream"].tell()
                state["stream"].close()
                done.append((state["path"], state["rows"], size))
                state.update(stream=None, writer=None, rows=0)

        def flush() -> None:
            nonlocal buffered, buffered_rows, buffered_bytes
            if not buffered_rows:
                return
            if state["writer"] is None:
                state["path"] = f"{directory}/{prefix}-{task}-{len(done):03d}.parquet"
                state["stream"] = io.new_output(state["path"]).create(overwrite=True)
                state["writer"] = pq.ParquetWriter(state["stream"], schema, compression="zstd")
            table = pa.Table.from_batches(buffered).select(schema.names).cast(schema)
            state["writer"].write_table(table, row_group_size=len(table))
            state["rows"] += len(table)
            buffered, buffered_rows, buffered_bytes = [], 0, 0
            if state["stream"].tell() >= target_bytes:
                close_file()

        for batch in prepare()(batches) if prepare is not None else batches:
            buffered.append(batch)
            buffered_rows += batch.num_rows
            buffered_bytes += batch.nbytes
            # In-memory Arrow is larger than compressed Parquet, so bounding the row group by the
            # target keeps files from overshooting it by more than one row group.
            if buffered_rows >= ROW_GROUP_ROWS or buffered_bytes >= target_bytes:
                flush()
        flush()
        close_file()
        yield pa.RecordBatch.from_pylist(
            [{"path": p, "rows": r, "bytes": b} for p, r, b in done], schema=_RESULT_SCHEMA
        )

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
    rows = df.select(*(columns or schema.names)).mapInArrow(fn, "path string, rows long, bytes long").collect()
    written = WrittenFiles(
        paths=sorted(r["path"] for r in rows), rows=sum(r["rows"] for r in rows), bytes=sum(r["bytes"] for r in rows)
    )
    log.info("wrote %d rows in %d files (%.1f MB) under %s", written.rows, len(written.paths), written.bytes / 1e6, directory)
    return written
