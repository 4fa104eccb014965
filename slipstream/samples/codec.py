"""The Kafka value codecs for samples, decoded in batches.

Two formats, chosen by the producer (`SLIPSTREAM_KAFKA_CODEC`); a reader needs no setting: a value
whose first byte is `binary_codec.MARKER` is binary, anything else JSON, so a topic may even mix
them (while producers switch).
- `json` (default): one JSON object per record, readable with any Kafka tool. A batch of values is
  joined into one buffer and parsed by Arrow's multithreaded JSON reader against the explicit
  schema. Only when a batch holds a bad record does decoding fall back to checking records one by
  one, to name the bad ones (dead letters). `event_time` travels as integer microseconds (UTC).
- `binary`: a compact fixed layout (`slipstream.samples.binary_codec`) decoded with numpy views and block
  copies; about half the bytes and a small fraction of the JSON parse's CPU.
Neither builds per-record Python objects on the hot path.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from slipstream.samples.binary_codec import MARKER, decode_binary, encode_binary
from slipstream.samples.schema import ARROW_SCHEMA, DENSE_COLUMNS, SAMPLE_COLUMNS
from slipstream.settings import KAFKA_CODECS as CODECS

MAX_VALUE_BYTES = 64 * 1024
"""A sample larger than this is a dead letter (a runaway sequence feature, a wrong topic)."""

WIRE_SCHEMA = pa.schema(
    [pa.field("event_time", pa.int64()) if f.name == "event_time" else f for f in ARROW_SCHEMA]
)
_PARSE = pj.ParseOptions(explicit_schema=WIRE_SCHEMA, unexpected_field_behavior="ignore")


def encode_samples(table: pa.Table, codec: str = "json") -> list[bytes]:
    """Encode sample rows (ARROW_SCHEMA) as values of `codec` (one of CODECS), one per row."""
    table = table.select(list(SAMPLE_COLUMNS))
    if codec == "binary":
        return encode_binary(table)
    if codec != "json":
        raise ValueError(f"unknown sample codec {codec!r}: use one of {', '.join(CODECS)}")
    micros = pc.cast(table.column("event_time"), pa.int64())
    cols = {name: table.column(name).to_pylist() for name in SAMPLE_COLUMNS if name != "event_time"}
    cols["event_time"] = micros.to_pylist()
    out = []
    for i in range(table.num_rows):
        out.append(json.dumps({k: cols[k][i] for k in SAMPLE_COLUMNS}, separators=(",", ":")).encode())
    return out


@dataclass
class DecodedBatch:
    table: pa.Table
    """Good rows in ARROW_SCHEMA, in input order."""
    good_index: np.ndarray
    """Index into the input values of each good row."""
    bad: list[tuple[int, str]] = field(default_factory=list)
    """(index into the input values, reason) for each dead letter."""


def _check_row(obj: object) -> str | None:
    if not isinstance(obj, dict):
        return "value is not a JSON object"
    for name in SAMPLE_COLUMNS:
        if obj.get(name) is None:
            return f"missing required field {name!r}"
    for name in DENSE_COLUMNS:
        v = obj[name]
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            return f"field {name!r} is not a finite number: {v!r}"
    if obj["label"] not in (0, 1):
        return f"field 'label' must be 0 or 1, got {obj['label']!r}"
    if not isinstance(obj["hist_items"], list):
        return "field 'hist_items' is not a list"
    return None


def _parse(buf: bytes) -> pa.Table:
    return pj.read_json(io.BytesIO(buf), parse_options=_PARSE)


def _validate_table(t: pa.Table) -> np.ndarray:
    """Row mask of rows with every field present, finite dense features and a 0/1 label."""
    ok = np.ones(t.num_rows, dtype=bool)
    for name in SAMPLE_COLUMNS:
        ok &= ~t.column(name).is_null().to_numpy(zero_copy_only=False)
    for name in DENSE_COLUMNS:
        vals = t.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        ok &= np.isfinite(np.nan_to_num(vals, nan=np.nan))
    lab = t.column("label").fill_null(-1).to_numpy(zero_copy_only=False)
    ok &= (lab == 0) | (lab == 1)
    return ok


def _to_samples(t: pa.Table) -> pa.Table:
    t = t.set_column(
        t.schema.get_field_index("event_time"),
        "event_time",
        pc.cast(t.column("event_time"), pa.timestamp("us", tz="UTC")),
    )
    return t.select(list(SAMPLE_COLUMNS)).cast(ARROW_SCHEMA)


def _join_if_all_plain(values: Sequence[bytes | None], joined: tuple[bytes, np.ndarray] | None = None) -> bytes | None:
    """The values joined by newlines when none is empty, None, over MAX_VALUE_BYTES or holds a
    newline (what the per-record screen in decode_samples checks); else None. `joined`: that join
    and the value lengths, when the caller has them."""
    if not values:
        return None
    if joined is None:
        try:
            joined = b"\n".join(values), np.fromiter(map(len, values), dtype=np.int64, count=len(values))  # type: ignore[arg-type]
        except TypeError:  # a None value
            return None
    buf, lengths = joined
    if lengths.min() == 0 or lengths.max() > MAX_VALUE_BYTES or buf.count(b"\n") != len(values) - 1:
        return None
    return buf


def decode_samples(values: Sequence[bytes | None]) -> DecodedBatch:
    """Decode a batch of Kafka values (of either codec) into sample columns, separating dead letters."""
    n = len(values)
    try:  # one newline join serves both codecs: JSON parses it, binary records are read in place
        buf = b"\n".join(values)  # type: ignore[arg-type]
    except TypeError:  # a None value (a tombstone): look at the values one by one
        binary = np.array([bool(v) and v[0] == MARKER for v in values], dtype=bool)  # type: ignore[index]
        buf, lengths = b"", np.zeros(n, dtype=np.int64)
    else:
        lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)  # type: ignore[arg-type]
        starts = np.cumsum(lengths + 1) - (lengths + 1)
        binary = lengths > 0
        binary[binary] = np.frombuffer(buf, dtype=np.uint8)[starts[binary]] == MARKER
    if not binary.any():
        return _decode_json(values, (buf, lengths) if buf else None)
    if not binary.all() or not buf:  # a mixed batch: each codec decodes its records
        return _merge(n, [(np.flatnonzero(binary), decode_samples), (np.flatnonzero(~binary), _decode_json)], values)
    bad = [(int(i), _oversize(int(lengths[i]))) for i in np.flatnonzero(lengths > MAX_VALUE_BYTES)]
    fit = np.flatnonzero(lengths <= MAX_VALUE_BYTES)
    table, good, more = decode_binary(buf, starts[fit], lengths[fit])
    return DecodedBatch(table, fit[good], sorted(bad + [(int(fit[j]), r) for j, r in more]))


def _merge(n: int, parts: list[tuple[np.ndarray, Callable[[list[bytes | None]], DecodedBatch]]],
           values: Sequence[bytes | None]) -> DecodedBatch:
    """Decode each subset of `values` with its decoder and put the results back in input order."""
    tables, good, bad = [], [], []
    for idx, decode in parts:
        out = decode([values[i] for i in idx])
        tables.append(out.table)
        good.append(idx[out.good_index])
        bad += [(int(idx[j]), reason) for j, reason in out.bad]
    order = np.argsort(np.concatenate(good), kind="stable")
    table = pa.concat_tables(tables).take(pa.array(order))
    return DecodedBatch(table, np.concatenate(good)[order], sorted(bad))


def _oversize(length: int) -> str:
    return f"value is {length} bytes, over the {MAX_VALUE_BYTES}-byte limit"


def _decode_json(values: Sequence[bytes | None], joined: tuple[bytes, np.ndarray] | None = None) -> DecodedBatch:
    n = len(values)
    bad: list[tuple[int, str]] = []
    keep: list[int] = []
    buf = _join_if_all_plain(values, joined)
    if buf is not None:  # the common case, screened with C-level calls only
        keep = list(range(n))
    for i, v in enumerate(values if buf is None else ()):
        if v is None or len(v) == 0:
            bad.append((i, "empty value"))
        elif len(v) > MAX_VALUE_BYTES:
            bad.append((i, _oversize(len(v))))
        elif b"\n" in v:
            bad.append((i, "value contains a newline: not a single JSON object"))
        else:
            keep.append(i)
    idx = np.asarray(keep, dtype=np.int64)
    if len(keep) == 0:
        return DecodedBatch(ARROW_SCHEMA.empty_table(), idx, bad)
    try:
        if buf is None:
            buf = b"\n".join(values[i] for i in keep)  # type: ignore[misc]
        parsed = _parse(buf)
        if parsed.num_rows != len(keep):
            raise pa.ArrowInvalid("row count mismatch")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return _decode_slow(values, keep, bad)
    ok = _validate_table(parsed)
    if not ok.all():
        for j in np.flatnonzero(~ok):
            reason = _reason(values[keep[j]])  # type: ignore[arg-type]
            bad.append((keep[j], reason or "invalid field value"))
        parsed = parsed.filter(pa.array(ok))
        idx = idx[ok]
    bad.sort()
    return DecodedBatch(_to_samples(parsed), idx, bad)


def _reason(value: bytes) -> str | None:
    try:
        obj = json.loads(value)
    except (ValueError, UnicodeDecodeError) as e:
        return f"not valid JSON: {e}"
    return _check_row(obj)


def _decode_slow(values: Sequence[bytes | None], keep: list[int], bad: list[tuple[int, str]]) -> DecodedBatch:
    good: list[int] = []
    for i in keep:
        v = values[i]
        assert v is not None
        reason = _reason(v)
        if reason is None:
            try:
                _parse(v)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                reason = f"wrong field type: {e}"
        if reason is None:
            good.append(i)
        else:
            bad.append((i, reason))
    bad.sort()
    idx = np.asarray(good, dtype=np.int64)
    if not good:
        return DecodedBatch(ARROW_SCHEMA.empty_table(), idx, bad)
    parsed = _parse(b"\n".join(values[i] for i in good))  # type: ignore[misc]
    return DecodedBatch(_to_samples(parsed), idx, bad)
