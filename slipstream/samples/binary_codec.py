"""The compact binary value format for samples (`SLIPSTREAM_KAFKA_CODEC=binary`), laid out from
the feature spec.

One record, little-endian, no padding (K sparse features = ids and categoricals, D dense, L lists
and sequences, in spec order):

    offset      size        field
    0           1           marker 0xB2 (never the first byte of a JSON value)
    1           1           label (0 or 1)
    2           1, 1, 1     D, K, L (checked against the reader's spec)
    5           2           sample id length S (bytes)
    7           4           the spec's tag (first 4 bytes of its digest; checked)
    11          8           event_time (us since the epoch, UTC)
    19          8 x K       sparse values (int64)
    19+8K       4 x D       dense values (float32)
    ...         2 x L       list lengths
    FIXED       8 x sum     list values (int64), list after list
    ...         S           sample id (UTF-8)

A batch is decoded without per-record Python: the values are joined once, the fixed part of every
record is read through a structured numpy view, and each list and the sample id of every record
are cut out of the joined buffer with Arrow's binary take (`slipstream.samples.ragged.take_ranges`).
Every check of the JSON path has its binary counterpart (truncated or oversize value, wrong head,
another spec's record, label, NaN/inf), so a bad record is a dead letter with a reason either way.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.samples.ragged import take_ranges
from slipstream.samples.schema import sample_arrow_schema
from slipstream.samples.spec import EVENT_TIME, LABEL, SAMPLE_ID, Spec

MARKER = 0xB2
OLD_MARKER = 0xB1
"""The fixed layout of Slipstream before feature specs: refused with a reason."""
_LIMIT = 0xFFFF


class BinaryLayout:
    """The binary format of one spec's samples."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.schema = sample_arrow_schema(spec)
        self.sparse = tuple(f.name for f in spec.sparse)
        self.dense = tuple(f.name for f in spec.dense)
        self.lists = tuple(f.name for f in spec.lists)
        self.tag = int(spec.digest[:8], 16)
        fields: list[tuple[Any, ...]] = [
            ("marker", "u1"), ("label", "u1"), ("n_dense", "u1"), ("n_sparse", "u1"), ("n_lists", "u1"),
            ("sid_len", "<u2"), ("tag", "<u4"), ("event_time", "<i8"),
        ]
        if self.sparse:
            fields.append(("sparse", "<i8", (len(self.sparse),)))
        if self.dense:
            fields.append(("dense", "<f4", (len(self.dense),)))
        if self.lists:
            fields.append(("list_len", "<u2", (len(self.lists),)))
        self.fixed = np.dtype(fields)

    @cached_property
    def empty(self) -> pa.Table:
        return self.schema.empty_table()

    def encode(self, table: pa.Table) -> list[bytes]:
        """Encode sample rows (the spec's columns, no nulls) as binary values, one per row."""
        n = table.num_rows
        for name in table.schema.names:
            if table.column(name).null_count:
                raise ValueError(f"the binary codec cannot encode a null {name!r}: fill it or encode with the JSON codec")
        head = np.zeros(n, dtype=self.fixed)
        head["marker"], head["n_dense"] = MARKER, len(self.dense)
        head["n_sparse"], head["n_lists"] = len(self.sparse), len(self.lists)
        head["tag"] = self.tag
        label = table.column(LABEL).to_numpy()
        if n and not ((label >= 0) & (label <= 255)).all():
            raise ValueError("the binary codec encodes label as one byte (0 or 1)")
        head["label"] = label
        head["event_time"] = pc.cast(table.column(EVENT_TIME), pa.int64()).to_numpy()
        if self.sparse:
            head["sparse"] = np.stack([table.column(c).to_numpy() for c in self.sparse], axis=1).reshape(n, len(self.sparse))
        if self.dense:
            head["dense"] = np.stack([table.column(c).to_numpy() for c in self.dense], axis=1).reshape(n, len(self.dense))
        sid = table.column(SAMPLE_ID).combine_chunks().cast(pa.large_binary())
        sid_offsets = np.frombuffer(sid.buffers()[1], dtype=np.int64, count=sid.offset + n + 1)[sid.offset:]
        sid_lengths = np.diff(sid_offsets)
        if n and sid_lengths.max() > _LIMIT:
            raise ValueError(f"the binary codec holds at most {_LIMIT} sample_id bytes per sample")
        head["sid_len"] = sid_lengths
        list_parts = []
        for j, name in enumerate(self.lists):
            col = table.column(name).combine_chunks()
            offs = col.offsets.to_numpy().astype(np.int64)
            lengths = np.diff(offs)
            if n and lengths.max() > _LIMIT:
                raise ValueError(f"the binary codec holds at most {_LIMIT} {name} values per sample")
            head["list_len"][:, j] = lengths
            values = col.values.to_numpy().astype("<i8")[offs[0]:offs[-1]]
            list_parts.append(self._blobs(n, (offs - offs[0]) * 8, values))
        sid_data = np.frombuffer(sid.buffers()[2] or b"", dtype=np.uint8)[sid_offsets[0]:sid_offsets[-1]]
        parts = [self._blobs(n, np.arange(n + 1, dtype=np.int64) * self.fixed.itemsize, head), *list_parts,
                 self._blobs(n, sid_offsets - sid_offsets[0], sid_data)]
        return pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.large_binary())).to_pylist()  # type: ignore[no-any-return]

    @staticmethod
    def _blobs(n: int, offsets: np.ndarray, data: np.ndarray) -> pa.Array:
        return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])

    def decode(self, buf: bytes, starts: np.ndarray, lengths: np.ndarray) -> tuple[pa.Table, np.ndarray, list[tuple[int, str]]]:
        """Decode the records buf[starts[i] : starts[i] + lengths[i]] (every one starting with
        MARKER). Returns (good rows, index of each good record, [(index, reason)] of bad ones)."""
        fixed = self.fixed
        data = np.frombuffer(buf, dtype=np.uint8)
        bad: list[tuple[int, str]] = []
        whole = lengths >= fixed.itemsize
        for i in np.flatnonzero(~whole):
            bad.append((int(i), f"binary sample of {int(lengths[i])} bytes is shorter than its {fixed.itemsize}-byte head"))
        idx = np.flatnonzero(whole)
        if len(idx) == 0:
            return self.empty, idx, bad
        # a view with one (overlapping) head at every byte: indexing it copies each record's head as a block
        at_every_byte = np.ndarray((len(data) - fixed.itemsize + 1,), dtype=np.dtype((np.void, fixed.itemsize)),
                                   buffer=data, strides=(1,))
        heads = at_every_byte[starts[idx]].view(fixed)
        list_len = heads["list_len"].astype(np.int64) if self.lists else np.zeros((len(idx), 0), dtype=np.int64)
        sid_len = heads["sid_len"].astype(np.int64)
        D, K, L = len(self.dense), len(self.sparse), len(self.lists)
        ok = np.ones(len(idx), dtype=bool)
        checks: list[tuple[np.ndarray, Callable[[int], str]]] = [
            ((heads["n_dense"] != D) | (heads["n_sparse"] != K) | (heads["n_lists"] != L),
             lambda j: f"binary sample has {heads['n_dense'][j]} dense, {heads['n_sparse'][j]} sparse and "
                       f"{heads['n_lists'][j]} list features, spec {self.spec.name} has {D}, {K} and {L}"),
            (heads["tag"] != self.tag,
             lambda j: f"binary sample was made for another feature spec (tag {int(heads['tag'][j]):08x}; "
                       f"{self.spec.name} v{self.spec.version} is {self.tag:08x})"),
            (fixed.itemsize + 8 * list_len.sum(axis=1) + sid_len != lengths[idx],
             lambda j: f"binary sample of {int(lengths[idx[j]])} bytes does not match its head "
                       f"({int(list_len[j].sum())} list values, {int(sid_len[j])}-byte sample id)"),
            (heads["label"] > 1, lambda j: f"field 'label' must be 0 or 1, got {int(heads['label'][j])}"),
        ]
        if D:
            checks.append((~np.isfinite(heads["dense"]).all(axis=1), lambda j: self._not_finite(heads["dense"][j])))
        for failed, reason in checks:
            for row in np.flatnonzero(failed & ok):
                bad.append((int(idx[row]), reason(int(row))))
            ok &= ~failed
        idx, heads, list_len, sid_len = idx[ok], heads[ok], list_len[ok], sid_len[ok]
        at = starts[idx] + fixed.itemsize
        columns: dict[str, pa.Array] = {}
        for j, name in enumerate(self.lists):
            end = at + 8 * list_len[:, j]
            values, offsets = take_ranges(data, at, end)
            columns[name] = pa.ListArray.from_arrays(pa.array((offsets // 8).astype(np.int32)),
                                                     pa.array(values.view("<i8"), pa.int64()))
            at = end
        sid_bytes, sid_offsets = take_ranges(data, at, at + sid_len)
        sid = pa.Array.from_buffers(pa.large_binary(), len(idx), [None, pa.py_buffer(sid_offsets), pa.py_buffer(sid_bytes)])
        try:
            sid = sid.cast(pa.large_string())
        except pa.ArrowInvalid:  # a record's id is not UTF-8: name it, decode the others again
            utf8 = np.array([_is_utf8(v) for v in sid.to_pylist()], dtype=bool)
            bad += [(int(idx[j]), "field 'sample_id' is not valid UTF-8") for j in np.flatnonzero(~utf8)]
            rest = idx[utf8]
            table, good, more = self.decode(buf, starts[rest], lengths[rest])
            return table, rest[good], sorted(bad + [(int(rest[j]), r) for j, r in more])
        bad.sort()
        columns[SAMPLE_ID] = sid.cast(pa.string())
        columns[EVENT_TIME] = pa.array(heads["event_time"]).view(pa.timestamp("us", tz="UTC"))
        for k, name in enumerate(self.sparse):
            columns[name] = pa.array(np.ascontiguousarray(heads["sparse"][:, k]))
        for k, name in enumerate(self.dense):
            columns[name] = pa.array(np.ascontiguousarray(heads["dense"][:, k]))
        columns[LABEL] = pa.array(heads["label"].astype(np.int32))
        return pa.table({name: columns[name] for name in self.schema.names}, schema=self.schema), idx, bad

    def _not_finite(self, dense: np.ndarray) -> str:
        k = int(np.flatnonzero(~np.isfinite(dense))[0])
        return f"field {self.dense[k]!r} is not a finite number: {float(dense[k])!r}"


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
