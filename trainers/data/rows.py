"""Training rows as columns: Arrow in, numpy columns through the shuffle, tensors out.

`Rows` is the one in-memory form both sources, the shuffle buffers and the mixer share. Its layout
comes from the feature spec (`RowLayout`): the single-valued sparse features (ids and
categoricals) as one (n, K) int64 matrix, the dense features as one (n, D) float32 matrix, and each
list or sequence feature as flat values + offsets (what `EmbeddingBag` and TorchRec's jagged
tensors consume), never padded. Every operation (slice, take, concat) is a vectorised numpy/Arrow
call. Sample ids stay an Arrow string array (no Python string objects per row); they are only
read by the audit.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from slipstream.samples.ragged import flat_list, take_list_column, take_lists
from slipstream.samples.schema import DEFAULT_SPEC
from slipstream.samples.spec import EVENT_TIME, LABEL, SAMPLE_ID, Spec
from slipstream.samples.transform import dense_values, hash_category

SOURCE_ICEBERG = 0
SOURCE_KAFKA = 1
SOURCE_REPLAY = 2
SOURCE_NAMES = ("iceberg", "kafka", "replay")


@dataclass(frozen=True)
class RowLayout:
    """Which sample columns make the sparse matrix, the dense matrix and the lists, in spec order,
    and what a column takes in rows written before the spec had it (its field's default, through
    the feature's transform)."""

    sparse: tuple[str, ...]
    dense: tuple[str, ...]
    lists: tuple[str, ...]
    sparse_defaults: tuple[int, ...]
    dense_defaults: tuple[float, ...]

    @classmethod
    def from_spec(cls, spec: Spec) -> "RowLayout":
        sparse_defaults = []
        for f in spec.sparse:
            value = _field_default(spec, f.field)
            if f.kind == "id" and isinstance(value, int):
                sparse_defaults.append(value)
            else:
                sparse_defaults.append(hash_category(str(value if value is not None else "")))
        dense_defaults = [float(dense_values(f, pa.array([float(_field_default(spec, f.field) or 0.0)]))[0])
                          for f in spec.dense]
        return cls(tuple(f.name for f in spec.sparse), tuple(f.name for f in spec.dense),
                   tuple(f.name for f in spec.lists), tuple(sparse_defaults), tuple(dense_defaults))

    @cached_property
    def read_columns(self) -> tuple[str, ...]:
        """The sample columns the trainer reads."""
        return (SAMPLE_ID, EVENT_TIME, *self.sparse, *self.dense, *self.lists, LABEL)

    @cached_property
    def schema(self) -> pa.Schema:
        return pa.schema(
            [pa.field(SAMPLE_ID, pa.string()), pa.field(EVENT_TIME, pa.timestamp("us", tz="UTC"))]
            + [pa.field(c, pa.int64()) for c in self.sparse] + [pa.field(c, pa.float32()) for c in self.dense]
            + [pa.field(c, pa.list_(pa.int64())) for c in self.lists] + [pa.field(LABEL, pa.int32())]
        )


def _field_default(spec: Spec, field_ref: str) -> Any:
    table, _, name = field_ref.rpartition(".")
    src = spec.source(table) if table else spec.events
    f = src.field(name)
    return f.default


DEFAULT_LAYOUT = RowLayout.from_spec(DEFAULT_SPEC)


def _np(col: pa.ChunkedArray, dtype: type, idx: np.ndarray | None = None) -> np.ndarray:
    a = col.to_numpy()
    return (a if idx is None else a[idx]).astype(dtype, copy=False)


def _filled(col: pa.ChunkedArray, default: Any) -> pa.ChunkedArray:
    """Nulls (rows of snapshots written before the spec had the feature) take its default."""
    return pc.fill_null(col, pa.scalar(default, col.type)) if col.null_count else col


def _matrix(table: pa.Table, names: Sequence[str], defaults: Sequence[Any], dtype: type,
            idx: np.ndarray | None, n: int) -> np.ndarray:
    present = set(table.column_names)
    if not names:
        return np.zeros((n, 0), dtype=dtype)
    cols = [_np(_filled(table.column(c), default), dtype, idx) if c in present else np.full(n, default, dtype=dtype)
            for c, default in zip(names, defaults)]
    return np.stack(cols, axis=1).reshape(n, len(names))


@dataclass
class Rows:
    sparse: np.ndarray
    """(n, K) int64: ids and hashed categoricals (`RowLayout.sparse`)."""
    dense: np.ndarray
    """(n, D) float32 (`RowLayout.dense`)."""
    list_values: tuple[np.ndarray, ...]
    list_offsets: tuple[np.ndarray, ...]
    """Per list feature (`RowLayout.lists`): flat int64 values and n + 1 offsets into them."""
    label: np.ndarray
    event_us: np.ndarray
    sample_id: pa.Array
    source: np.ndarray
    """int8 SOURCE_* code per row."""
    epoch: np.ndarray
    partition: np.ndarray
    offset: np.ndarray
    record_ms: np.ndarray
    """Kafka record timestamp (ms) or -1."""
    consumed_ms: np.ndarray
    """Wall-clock ms at which the row was consumed from Kafka, or -1."""

    def __len__(self) -> int:
        return len(self.label)

    @classmethod
    def from_arrow(
        cls,
        table: pa.Table,
        layout: RowLayout = DEFAULT_LAYOUT,
        *,
        source: int,
        epoch: int = -1,
        partition: np.ndarray | None = None,
        offset: np.ndarray | None = None,
        record_ms: np.ndarray | None = None,
        consumed_ms: np.ndarray | None = None,
        take: np.ndarray | None = None,
    ) -> "Rows":
        """The table's rows, or with `take` only the rows at those indices in that order (the same
        as `from_arrow(table.take(take))` or `from_arrow(table).take(take)`, in one gather per
        column). `partition` ... `consumed_ms` are per row of `table`. A feature column the table
        lacks (rows written before the spec had it) takes the feature's default."""
        idx = None if take is None else np.asarray(take, dtype=np.int64)
        n = table.num_rows if idx is None else len(idx)
        if idx is not None and n and (idx.min() < 0 or idx.max() >= table.num_rows):
            # numpy would wrap a negative row around and Arrow would refuse it: say which it is
            raise IndexError(f"rows to take must be in [0, {table.num_rows}) (got {idx.min()}..{idx.max()})")
        present = set(table.column_names)
        values_list, offsets_list = [], []
        for name in layout.lists:
            if name in present:
                col = table.column(name)
                values, offs = flat_list(col) if idx is None else take_list_column(col, idx)
            else:
                values, offs = np.zeros(0, dtype=np.int64), np.zeros(n + 1, dtype=np.int64)
            values_list.append(values)
            offsets_list.append(offs)
        minus = np.full(n, -1, dtype=np.int64)
        sid = table.column(SAMPLE_ID)
        sid_arr = sid.combine_chunks() if isinstance(sid, pa.ChunkedArray) else sid
        if idx is not None:
            sid_arr = sid_arr.take(pa.array(idx))

        def per_row(a: np.ndarray | None, dtype: type) -> np.ndarray | None:
            return None if a is None else (a if idx is None else a[idx]).astype(dtype)

        partition, offset, record_ms, consumed_ms = (per_row(partition, np.int32), per_row(offset, np.int64),
                                                     per_row(record_ms, np.int64), per_row(consumed_ms, np.int64))
        event_us = pc.cast(table.column(EVENT_TIME), pa.int64()).to_numpy()
        return cls(
            sparse=_matrix(table, layout.sparse, layout.sparse_defaults, np.int64, idx, n),
            dense=_matrix(table, layout.dense, layout.dense_defaults, np.float32, idx, n),
            list_values=tuple(values_list),
            list_offsets=tuple(offsets_list),
            label=_np(table.column(LABEL), np.float32, idx),
            event_us=event_us if idx is None else event_us[idx],
            sample_id=sid_arr,
            source=np.full(n, source, dtype=np.int8),
            epoch=np.full(n, epoch, dtype=np.int32),
            partition=np.full(n, -1, dtype=np.int32) if partition is None else partition,
            offset=minus.copy() if offset is None else offset,
            record_ms=minus.copy() if record_ms is None else record_ms,
            consumed_ms=minus.copy() if consumed_ms is None else consumed_ms,
        )

    @classmethod
    def empty(cls, layout: RowLayout = DEFAULT_LAYOUT) -> "Rows":
        return cls.from_arrow(layout.schema.empty_table(), layout, source=SOURCE_ICEBERG)

    def to_arrow(self, layout: RowLayout = DEFAULT_LAYOUT) -> pa.Table:
        """The rows as sample columns (for profiles and tests)."""
        cols: dict[str, pa.Array] = {
            SAMPLE_ID: self.sample_id,
            EVENT_TIME: pa.array(self.event_us, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        }
        for j, name in enumerate(layout.sparse):
            cols[name] = pa.array(np.ascontiguousarray(self.sparse[:, j]), pa.int64())
        for j, name in enumerate(layout.dense):
            cols[name] = pa.array(np.ascontiguousarray(self.dense[:, j]), pa.float32())
        for name, values, offs in zip(layout.lists, self.list_values, self.list_offsets):
            base = int(offs[0]) if len(offs) else 0
            cols[name] = pa.ListArray.from_arrays(pa.array((offs - base).astype(np.int32)),
                                                  pa.array(values[base:int(offs[-1]) if len(offs) else 0], pa.int64()))
        cols[LABEL] = pa.array(self.label.astype(np.int32))
        return pa.table(cols, schema=layout.schema)

    def slice(self, start: int, stop: int) -> "Rows":
        stop = min(stop, len(self))
        lists_v, lists_o = [], []
        for values, offsets in zip(self.list_values, self.list_offsets):
            o = offsets[start : stop + 1]
            a = int(o[0])
            lists_v.append(values[a : int(o[-1])])
            lists_o.append(o - a)
        # once per batch on the training thread: views only, no per-field getattr
        return Rows(
            sparse=self.sparse[start:stop], dense=self.dense[start:stop],
            list_values=tuple(lists_v), list_offsets=tuple(lists_o),
            label=self.label[start:stop], event_us=self.event_us[start:stop],
            sample_id=self.sample_id.slice(start, stop - start), source=self.source[start:stop],
            epoch=self.epoch[start:stop], partition=self.partition[start:stop], offset=self.offset[start:stop],
            record_ms=self.record_ms[start:stop], consumed_ms=self.consumed_ms[start:stop],
        )

    def take(self, idx: np.ndarray) -> "Rows":
        idx = np.asarray(idx, dtype=np.int64)
        taken = [take_lists(v, o, idx) for v, o in zip(self.list_values, self.list_offsets)]
        kw = {name: getattr(self, name)[idx] for name in _PLAIN_FIELDS}
        return Rows(**kw, list_values=tuple(t[0] for t in taken), list_offsets=tuple(t[1] for t in taken),
                    sample_id=self.sample_id.take(pa.array(idx)))

    def mask(self, keep: np.ndarray) -> "Rows":
        return self if keep.all() else self.take(np.flatnonzero(keep))

    @staticmethod
    def first(parts: Sequence["Rows"], layout: RowLayout, cap: int) -> "Rows":
        """The first `cap` rows of `parts` together (all of them when fewer; none: empty)."""
        rows = Rows.concat(parts) if parts else Rows.empty(layout)
        return rows.slice(0, cap) if len(rows) > cap else rows

    @staticmethod
    def concat(parts: Sequence["Rows"]) -> "Rows":
        parts = [p for p in parts if len(p)] or list(parts[:1])
        if len(parts) == 1:
            return parts[0]
        values, offsets = [], []
        for j in range(len(parts[0].list_values)):
            shift = np.cumsum([0] + [len(p.list_values[j]) for p in parts[:-1]])
            offsets.append(np.concatenate([parts[0].list_offsets[j][:1]]
                                          + [p.list_offsets[j][1:] + s for p, s in zip(parts, shift)]))
            values.append(np.concatenate([p.list_values[j] for p in parts]))
        kw = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _PLAIN_FIELDS}
        return Rows(**kw, list_values=tuple(values), list_offsets=tuple(offsets),
                    sample_id=pa.concat_arrays([p.sample_id for p in parts]))


_PLAIN_FIELDS = [f.name for f in fields(Rows) if f.name not in ("list_values", "list_offsets", "sample_id")]
"""Per-row numpy columns of Rows (sliced, taken and concatenated alike)."""


@dataclass
class Features:
    """Model inputs as tensors (on the training device once `to` has run)."""

    sparse: torch.Tensor
    """(n, K) int64."""
    dense: torch.Tensor
    """(n, D) float32."""
    list_values: tuple[torch.Tensor, ...]
    list_offsets: tuple[torch.Tensor, ...]
    """n offsets each (start of each bag), the EmbeddingBag convention."""
    label: torch.Tensor

    @classmethod
    def from_rows(cls, rows: Rows, pin: bool = False) -> "Features":
        arrays = (rows.sparse, rows.dense, *rows.list_values, *(o[:-1] for o in rows.list_offsets), rows.label)
        if pin or not all(a.flags.c_contiguous and a.flags.writeable for a in arrays):
            tensors = [_tensor(a, pin) for a in arrays]
        else:  # the common case, once per batch: views of writeable contiguous arrays, nothing to check
            tensors = list(map(torch.from_numpy, arrays))
        n_lists = len(rows.list_values)
        return cls(sparse=tensors[0], dense=tensors[1], list_values=tuple(tensors[2:2 + n_lists]),
                   list_offsets=tuple(tensors[2 + n_lists:2 + 2 * n_lists]), label=tensors[-1])

    def to(self, device: torch.device) -> "Features":
        if device.type == "cpu":
            return self
        # non_blocking only overlaps with compute when the source is pinned (the loader pins on CUDA)
        move = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        return Features(sparse=move(self.sparse), dense=move(self.dense),
                        list_values=tuple(map(move, self.list_values)),
                        list_offsets=tuple(map(move, self.list_offsets)), label=move(self.label))

    def __len__(self) -> int:
        return int(self.label.shape[0])


def _tensor(a: np.ndarray, pin: bool) -> torch.Tensor:
    a = np.ascontiguousarray(a)
    if a.flags.writeable:
        x = torch.from_numpy(a)
    else:
        with warnings.catch_warnings():  # read-only Arrow buffers; the tensors are only read
            warnings.simplefilter("ignore", UserWarning)
            x = torch.from_numpy(a)
    return x.pin_memory() if pin else x


def rows_to_state(rows: Rows) -> dict[str, object]:
    """Rows as plain numpy arrays (and id strings) for a checkpoint: buffers are small."""
    state: dict[str, object] = {f.name: getattr(rows, f.name) for f in fields(rows) if f.name != "sample_id"}
    state["list_values"] = tuple(rows.list_values)
    state["list_offsets"] = tuple(rows.list_offsets)
    state["sample_id"] = rows.sample_id.to_pylist()
    return state


def rows_from_state(state: dict[str, object]) -> Rows:
    kw = dict(state)
    kw["sample_id"] = pa.array(kw["sample_id"], pa.string())
    kw["list_values"] = tuple(kw["list_values"])  # type: ignore[arg-type]
    kw["list_offsets"] = tuple(kw["list_offsets"])  # type: ignore[arg-type]
    return Rows(**kw)  # type: ignore[arg-type]
