"""Training rows as columns: Arrow in, numpy columns through the shuffle, tensors out.

`Rows` is the one in-memory form both sources, the shuffle buffers and the mixer share. Every
operation (slice, take, concat) is a vectorised numpy/Arrow call; the variable-length history
stays as flat values + offsets (what `EmbeddingBag` consumes), never padded. Sample ids stay an
Arrow string array (no Python string objects per row); they are only read by the audit.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from slipstream.samples.ragged import flat_list, take_list_column, take_lists
from slipstream.samples.schema import CATEGORICAL_COLUMNS, DENSE_COLUMNS

SOURCE_ICEBERG = 0
SOURCE_KAFKA = 1
SOURCE_REPLAY = 2
SOURCE_NAMES = ("iceberg", "kafka", "replay")

READ_COLUMNS = ("sample_id", "event_time", "user_id", "item_id", *DENSE_COLUMNS, *CATEGORICAL_COLUMNS, "hist_items", "label")
"""The sample columns the trainer reads (all of them today; listed so a new column is opt-in)."""


def _np(col: pa.ChunkedArray, dtype: type, idx: np.ndarray | None = None) -> np.ndarray:
    a = col.to_numpy()
    return (a if idx is None else a[idx]).astype(dtype, copy=False)


@dataclass
class Rows:
    user: np.ndarray
    item: np.ndarray
    cats: np.ndarray
    """(n, len(CATEGORICAL_COLUMNS)) int64 hashes."""
    dense: np.ndarray
    """(n, len(DENSE_COLUMNS)) float32."""
    hist_values: np.ndarray
    hist_offsets: np.ndarray
    """n + 1 offsets into hist_values."""
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
        column). `partition` ... `consumed_ms` are per row of `table`."""
        idx = None if take is None else np.asarray(take, dtype=np.int64)
        n = table.num_rows if idx is None else len(idx)
        if idx is not None and n and (idx.min() < 0 or idx.max() >= table.num_rows):
            # numpy would wrap a negative row around and Arrow would refuse it: say which it is
            raise IndexError(f"rows to take must be in [0, {table.num_rows}) (got {idx.min()}..{idx.max()})")
        hist = table.column("hist_items")
        values, offs = flat_list(hist) if idx is None else take_list_column(hist, idx)
        minus = np.full(n, -1, dtype=np.int64)
        sid = table.column("sample_id")
        sid_arr = sid.combine_chunks() if isinstance(sid, pa.ChunkedArray) else sid
        if idx is not None:
            sid_arr = sid_arr.take(pa.array(idx))

        def per_row(a: np.ndarray | None, dtype: type) -> np.ndarray | None:
            return None if a is None else (a if idx is None else a[idx]).astype(dtype)

        partition, offset, record_ms, consumed_ms = (per_row(partition, np.int32), per_row(offset, np.int64),
                                                     per_row(record_ms, np.int64), per_row(consumed_ms, np.int64))
        event_us = pc.cast(table.column("event_time"), pa.int64()).to_numpy()
        return cls(
            user=_np(table.column("user_id"), np.int64, idx),
            item=_np(table.column("item_id"), np.int64, idx),
            cats=np.stack([_np(table.column(c), np.int64, idx) for c in CATEGORICAL_COLUMNS], axis=1).reshape(n, len(CATEGORICAL_COLUMNS)),
            dense=np.stack([_np(table.column(c), np.float32, idx) for c in DENSE_COLUMNS], axis=1).reshape(n, len(DENSE_COLUMNS)),
            hist_values=values,
            hist_offsets=offs,
            label=_np(table.column("label"), np.float32, idx),
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
    def empty(cls) -> "Rows":
        from slipstream.samples.schema import ARROW_SCHEMA

        return cls.from_arrow(ARROW_SCHEMA.empty_table(), source=SOURCE_ICEBERG)

    def _plain(self) -> list[str]:
        return _PLAIN_FIELDS

    def slice(self, start: int, stop: int) -> "Rows":
        stop = min(stop, len(self))
        offsets = self.hist_offsets[start : stop + 1]
        a = int(offsets[0])
        # once per batch on the training thread: views only, no per-field getattr
        return Rows(
            user=self.user[start:stop], item=self.item[start:stop], cats=self.cats[start:stop],
            dense=self.dense[start:stop], hist_values=self.hist_values[a : int(offsets[-1])], hist_offsets=offsets - a,
            label=self.label[start:stop], event_us=self.event_us[start:stop],
            sample_id=self.sample_id.slice(start, stop - start), source=self.source[start:stop],
            epoch=self.epoch[start:stop], partition=self.partition[start:stop], offset=self.offset[start:stop],
            record_ms=self.record_ms[start:stop], consumed_ms=self.consumed_ms[start:stop],
        )

    def take(self, idx: np.ndarray) -> "Rows":
        idx = np.asarray(idx, dtype=np.int64)
        values, offsets = take_lists(self.hist_values, self.hist_offsets, idx)
        kw = {name: getattr(self, name)[idx] for name in self._plain()}
        return Rows(**kw, hist_values=values, hist_offsets=offsets, sample_id=self.sample_id.take(pa.array(idx)))

    def mask(self, keep: np.ndarray) -> "Rows":
        return self if keep.all() else self.take(np.flatnonzero(keep))

    @staticmethod
    def concat(parts: Sequence["Rows"]) -> "Rows":
        parts = [p for p in parts if len(p)] or list(parts[:1])
        if len(parts) == 1:
            return parts[0]
        shift = np.cumsum([0] + [len(p.hist_values) for p in parts[:-1]])
        offsets = np.concatenate([parts[0].hist_offsets[:1]] + [p.hist_offsets[1:] + s for p, s in zip(parts, shift)])
        kw = {name: np.concatenate([getattr(p, name) for p in parts]) for name in parts[0]._plain()}
        return Rows(
            **kw,
            hist_values=np.concatenate([p.hist_values for p in parts]),
            hist_offsets=offsets,
            sample_id=pa.concat_arrays([p.sample_id for p in parts]),
        )


_PLAIN_FIELDS = [f.name for f in fields(Rows) if f.name not in ("hist_values", "hist_offsets", "sample_id")]
"""Per-row numpy columns of Rows (sliced, taken and concatenated alike)."""


@dataclass
class Features:
    """Model inputs as tensors (on the training device once `to` has run)."""

    user: torch.Tensor
    item: torch.Tensor
    cats: torch.Tensor
    dense: torch.Tensor
    hist_values: torch.Tensor
    hist_offsets: torch.Tensor
    """n offsets (start of each bag), the EmbeddingBag convention."""
    label: torch.Tensor

    @classmethod
    def from_rows(cls, rows: Rows, pin: bool = False) -> "Features":
        arrays = (rows.user, rows.item, rows.cats, rows.dense, rows.hist_values, rows.hist_offsets[:-1], rows.label)
        if pin or not all(a.flags.c_contiguous and a.flags.writeable for a in arrays):
            tensors = [_tensor(a, pin) for a in arrays]
        else:  # the common case, once per batch: views of writeable contiguous arrays, nothing to check
            tensors = list(map(torch.from_numpy, arrays))
        user, item, cats, dense, hist_values, hist_offsets, label = tensors
        return cls(user=user, item=item, cats=cats, dense=dense, hist_values=hist_values, hist_offsets=hist_offsets, label=label)

    def to(self, device: torch.device) -> "Features":
        if device.type == "cpu":
            return self
        # non_blocking only overlaps with compute when the source is pinned (the loader pins on CUDA)
        return Features(**{f.name: getattr(self, f.name).to(device, non_blocking=True) for f in fields(self)})

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
    state["sample_id"] = rows.sample_id.to_pylist()
    return state


def rows_from_state(state: dict[str, object]) -> Rows:
    kw = dict(state)
    kw["sample_id"] = pa.array(kw["sample_id"], pa.string())
    return Rows(**kw)  # type: ignore[arg-type]
