"""The writer's per-task step: raw events in (sorted by the spec's key, time and sample id), samples
out, through the spec's Arrow-level featurizer. No pyspark here: this runs inside the writer's
`mapInArrow` tasks (and in tests on plain Arrow tables).

Why the features are computed here and not in Spark's JVM: one implementation serves the batch
job, the stream joiner and the generator (`slipstream.samples.transform`), so the two paths cannot
skew; and it is the cheaper place anyway (a day holds a handful of distinct categorical strings,
hashed once each; a user's history is sliced with numpy, not built per row as JVM arrays).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.samples.spec import SAMPLE_ID, Spec
from slipstream.samples.transform import Featurizer


def tables_to_ipc(tables: Mapping[str, pa.Table]) -> dict[str, bytes]:
    """Side tables as Arrow IPC bytes (what a Spark broadcast carries to the tasks)."""
    out = {}
    for name, table in tables.items():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        out[name] = sink.getvalue().to_pybytes()
    return out


def tables_from_ipc(blobs: Mapping[str, bytes]) -> dict[str, pa.Table]:
    return {name: pa.ipc.open_stream(pa.py_buffer(b)).read_all() for name, b in blobs.items()}


class SampleFinisher:
    """Streams one task's batches through the featurizer; with `dedupe`, first drops a row whose
    (key, sample id) equals the previous row's (the input order puts the copy to keep first; see
    `spark_jobs.transforms.one_shuffle_rows`), across batch boundaries too.

    `tables` are the spec's side tables, as tables, as `tables_to_ipc` bytes, or as a Spark
    broadcast of those bytes (read once per task). `day`: a range job's date column, part of the
    copy's identity (an id seen on two days is two samples, as day by day) and dropped before the
    featurizer."""

    def __init__(self, spec: Spec, key: str, tables: Any = None, dedupe: bool = False, day: str = "") -> None:
        self.spec = spec
        self.key = key
        self.dedupe = dedupe
        self.day = day
        self.dropped = 0
        self._tables = tables
        self._last_key: tuple[Any, ...] | None = None

    def _featurizer(self) -> Featurizer:
        tables = self._tables
        if tables is not None and hasattr(tables, "value"):  # a broadcast
            tables = tables.value
        if tables and all(isinstance(v, bytes) for v in tables.values()):
            tables = tables_from_ipc(tables)
        return Featurizer(self.spec, tables or {})

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        featurizer = self._featurizer()
        for batch in batches:
            if self.dedupe and batch.num_rows:
                batch = self._drop_adjacent_copies(batch)
            if self.day and self.day in batch.schema.names:
                batch = batch.drop_columns([self.day])
            if batch.num_rows:
                yield from featurizer.samples(pa.Table.from_batches([batch])).to_batches()

    def _drop_adjacent_copies(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        cols = [batch.column(self.key), batch.column(SAMPLE_ID)] + ([batch.column(self.day)] if self.day else [])
        same = np.zeros(batch.num_rows, dtype=bool)
        if batch.num_rows > 1:
            same[1:] = True
            for col in cols:
                same[1:] &= pc.equal(col[1:], col[:-1]).to_numpy(zero_copy_only=False)
        if self._last_key is not None:
            same[0] = tuple(c[0].as_py() for c in cols) == self._last_key
        self._last_key = tuple(c[-1].as_py() for c in cols)
        n = int(np.count_nonzero(same))
        if not n:
            return batch
        self.dropped += n
        return batch.filter(pa.array(~same))
