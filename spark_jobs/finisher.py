"""The writer's per-task step: raw events in (sorted by the spec's key, time and sample id), samples
out, through the spec's Arrow-level featurizer. No pyspark here: this runs inside the writer's
`mapInArrow` tasks (and in tests on plain Arrow tables).

Why the features are computed here and not in Spark's JVM: one implementation serves the batch
job, the stream joiner and the generator (`slipstream.samples.transform`), so the two paths cannot
skew; and it is the cheaper place anyway (a day holds a handful of distinct categorical strings,
hashed once each; a user's history is sliced with numpy, not built per row as JVM arrays).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

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

    `tables` are the spec's side tables, as tables or as a Spark broadcast of `tables_to_ipc`
    bytes (read once per task)."""

    def __init__(self, spec: Spec, key: str, tables: Any = None, dedupe: bool = False) -> None:
        self.spec = spec
        self.key = key
        self.dedupe = dedupe
        self.dropped = 0
        self._tables = tables
        self._last_key: tuple[Any, str] | None = None

    def _featurizer(self) -> Featurizer:
        tables = self._tables
        if tables is not None and hasattr(tables, "value"):  # a broadcast
            tables = tables_from_ipc(tables.value)
        return Featurizer(self.spec, tables or {})

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        featurizer = self._featurizer()
        for batch in batches:
            if self.dedupe and batch.num_rows:
                batch = self._drop_adjacent_copies(batch)
            if batch.num_rows:
                yield from featurizer.samples(pa.Table.from_batches([batch])).to_batches()

    def _drop_adjacent_copies(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        keys = batch.column(self.key)
        ids = batch.column(SAMPLE_ID)
        same = np.zeros(batch.num_rows, dtype=bool)
        if batch.num_rows > 1:
            same_key = pc.equal(keys[1:], keys[:-1]).to_numpy(zero_copy_only=False)
            same_id = pc.equal(ids[1:], ids[:-1]).to_numpy(zero_copy_only=False)
            same[1:] = same_key & same_id
        if self._last_key is not None:
            same[0] = (keys[0].as_py(), ids[0].as_py()) == self._last_key
        self._last_key = (keys[-1].as_py(), ids[-1].as_py())
        n = int(np.count_nonzero(same))
        if not n:
            return batch
        self.dropped += n
        return batch.filter(pa.array(~same))
