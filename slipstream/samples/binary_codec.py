"""The compact binary value format for samples (`SLIPSTREAM_KAFKA_CODEC=binary`).

One record, little-endian, no padding:

    offset  size        field
    0       1           marker 0xB1 (never the first byte of a JSON value)
    1       1           label (0 or 1)
    2       1, 1        number of dense, of categorical features (checked against this schema)
    4       2, 2        history length H, sample id length S (bytes)
    8       8 x 3       event_time (us since the epoch, UTC), user_id, item_id
    32      8 x C       categorical hashes (int64)
    32+8C   4 x D       dense features (float32)
    FIXED   8 x H       history item ids (int64)
    +8H     S           sample id (UTF-8)

A batch is decoded without per-record Python: the values are joined once, the fixed part of every
record is read through a structured numpy view, and the history and sample id of every record are
cut out of the joined buffer with Arrow's binary take (`slipstream.samples.ragged.take_ranges`). Every
check of the JSON path has its binary counterpart (truncated or oversize value, wrong header,
label, NaN/inf), so a bad record is a dead letter with a reason either way.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.samples.ragged import take_ranges
from slipstream.samples.schema import ARROW_SCHEMA, CATEGORICAL_COLUMNS, DENSE_COLUMNS

MARKER = 0xB1
_C, _D = len(CATEGORICAL_COLUMNS), len(DENSE_COLUMNS)
FIXED = np.dtype([
    ("marker", "u1"), ("label", "u1"), ("n_dense", "u1"), ("n_cats", "u1"),
    ("hist_len", "<u2"), ("sid_len", "<u2"),
    ("event_time", "<i8"), ("user_id", "<i8"), ("item_id", "<i8"),
    ("cats", "<i8", (_C,)), ("dense", "<f4", (_D,)),
])
"""The fixed-size head of a record."""
_LIMIT = 0xFFFF


def encode_binary(table: pa.Table) -> list[bytes]:
    """Encode sample rows (ARROW_SCHEMA, no nulls) as binary values, one per row."""
    n = table.num_rows
    for name in table.schema.names:
        if table.column(name).null_count:
            raise ValueError(f"the binary codec cannot encode a null {name!r}: fill it or encode with the JSON codec")
    head = np.zeros(n, dtype=FIXED)
    head["marker"], head["n_dense"], head["n_cats"] = MARKER, _D, _C
    label = table.column("label").to_numpy()
    if n and not ((label >= 0) & (label <= 255)).all():
        raise ValueError("the binary codec encodes label as one byte (0 or 1)")
    head["label"] = label
    hist = table.column("hist_items").combine_chunks()
    hist_offsets = hist.offsets.to_numpy().astype(np.int64)
    sid = table.column("sample_id").combine_chunks().cast(pa.large_binary())
    sid_offsets = np.frombuffer(sid.buffers()[1], dtype=np.int64, count=sid.offset + n + 1)[sid.offset :]
    for name, lengths in (("hist_items", np.diff(hist_offsets)), ("sample_id", np.diff(sid_offsets))):
        if n and lengths.max() > _LIMIT:
            raise ValueError(f"the binary codec holds at most {_LIMIT} {name} values/bytes per sample")
    head["hist_len"], head["sid_len"] = np.diff(hist_offsets), np.diff(sid_offsets)
    head["event_time"] = pc.cast(table.column("event_time"), pa.int64()).to_numpy()
    head["user_id"], head["item_id"] = table.column("user_id").to_numpy(), table.column("item_id").to_numpy()
    head["cats"] = np.stack([table.column(c).to_numpy() for c in CATEGORICAL_COLUMNS], axis=1).reshape(n, _C)
    head["dense"] = np.stack([table.column(c).to_numpy() for c in DENSE_COLUMNS], axis=1).reshape(n, _D)

    def blobs(offsets: np.ndarray, data: pa.Buffer | np.ndarray) -> pa.Array:
        return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])

    fixed = blobs(np.arange(n + 1, dtype=np.int64) * FIXED.itemsize, head)
    items = blobs((hist_offsets - hist_offsets[0]) * 8,
                  hist.values.to_numpy().astype("<i8")[hist_offsets[0] : hist_offsets[-1]])
    sid_data = np.frombuffer(sid.buffers()[2] or b"", dtype=np.uint8)[sid_offsets[0] : sid_offsets[-1]]
    ids = blobs(sid_offsets - sid_offsets[0], sid_data)
    return pc.binary_join_element_wise(fixed, items, ids, pa.scalar(b"", pa.large_binary())).to_pylist()  # type: ignore[no-any-return]


def decode_binary(buf: bytes, starts: np.ndarray, lengths: np.ndarray) -> tuple[pa.Table, np.ndarray, list[tuple[int, str]]]:
    """Decode the records buf[starts[i] : starts[i] + lengths[i]] (every one starting with MARKER).
    Returns (good rows in ARROW_SCHEMA, index of each good record, [(index, reason)] of bad ones)."""
    data = np.frombuffer(buf, dtype=np.uint8)
    bad: list[tuple[int, str]] = []
    whole = lengths >= FIXED.itemsize
    for i in np.flatnonzero(~whole):
        bad.append((int(i), f"binary sample of {int(lengths[i])} bytes is shorter than its {FIXED.itemsize}-byte head"))
    idx = np.flatnonzero(whole)
    if len(idx) == 0:
        return ARROW_SCHEMA.empty_table(), idx, bad
    # a view with one (overlapping) head at every byte: indexing it copies each record's head as a block
    at_every_byte = np.ndarray((len(data) - FIXED.itemsize + 1,), dtype=np.dtype((np.void, FIXED.itemsize)),
                               buffer=data, strides=(1,))
    heads = at_every_byte[starts[idx]].view(FIXED)
    hist_len = heads["hist_len"].astype(np.int64)
    sid_len = heads["sid_len"].astype(np.int64)
    ok = np.ones(len(idx), dtype=bool)
    checks = (
        ((heads["n_dense"] != _D) | (heads["n_cats"] != _C),
         lambda j: f"binary sample has {heads['n_dense'][j]} dense and {heads['n_cats'][j]} categorical features, "
                   f"this schema {_D} and {_C}"),
        (FIXED.itemsize + 8 * hist_len + sid_len != lengths[idx],
         lambda j: f"binary sample of {int(lengths[idx[j]])} bytes does not match its head "
                   f"({int(hist_len[j])} history items, {int(sid_len[j])}-byte sample id)"),
        (heads["label"] > 1, lambda j: f"field 'label' must be 0 or 1, got {int(heads['label'][j])}"),
        (~np.isfinite(heads["dense"]).all(axis=1), lambda j: _not_finite(heads["dense"][j])),
    )
    for failed, reason in checks:
        for j in np.flatnonzero(failed & ok):
            bad.append((int(idx[j]), reason(j)))
        ok &= ~failed
    idx, heads, hist_len, sid_len = idx[ok], heads[ok], hist_len[ok], sid_len[ok]
    hist_at = starts[idx] + FIXED.itemsize
    sid_at = hist_at + 8 * hist_len
    hist_bytes, hist_offsets = take_ranges(data, hist_at, sid_at)
    sid_bytes, sid_offsets = take_ranges(data, sid_at, sid_at + sid_len)
    sid = pa.Array.from_buffers(pa.large_binary(), len(idx), [None, pa.py_buffer(sid_offsets), pa.py_buffer(sid_bytes)])
    try:
        sid = sid.cast(pa.large_string())
    except pa.ArrowInvalid:  # a record's id is not UTF-8: name it, decode the others again
        utf8 = np.array([_is_utf8(v) for v in sid.to_pylist()], dtype=bool)
        bad += [(int(idx[j]), "field 'sample_id' is not valid UTF-8") for j in np.flatnonzero(~utf8)]
        rest = idx[utf8]
        table, good, more = decode_binary(buf, starts[rest], lengths[rest])
        return table, rest[good], sorted(bad + [(int(rest[j]), r) for j, r in more])
    bad.sort()
    items = pa.array(hist_bytes.view("<i8"), pa.int64())
    columns = {
        "sample_id": sid.cast(pa.string()),
        "event_time": pa.array(heads["event_time"]).view(pa.timestamp("us", tz="UTC")),
        "user_id": pa.array(heads["user_id"]),
        "item_id": pa.array(heads["item_id"]),
        **{c: pa.array(np.ascontiguousarray(heads["dense"][:, k])) for k, c in enumerate(DENSE_COLUMNS)},
        **{c: pa.array(np.ascontiguousarray(heads["cats"][:, k])) for k, c in enumerate(CATEGORICAL_COLUMNS)},
        "hist_items": pa.ListArray.from_arrays(pa.array((hist_offsets // 8).astype(np.int32)), items),
        "label": pa.array(heads["label"].astype(np.int32)),
    }
    return pa.table(columns, schema=ARROW_SCHEMA), idx, bad


def _not_finite(dense: np.ndarray) -> str:
    k = int(np.flatnonzero(~np.isfinite(dense))[0])
    return f"field {DENSE_COLUMNS[k]!r} is not a finite number: {float(dense[k])!r}"


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
