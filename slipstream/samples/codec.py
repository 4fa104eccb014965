"""The Kafka value codecs for samples, decoded in batches, laid out from the feature spec.

Two formats, chosen by the producer (`SLIPSTREAM_KAFKA_CODEC`); a reader needs no setting: a value
whose first byte is `binary_codec.MARKER` is binary, anything else JSON, so a topic may even mix
them (while producers switch). Both carry the spec's sample columns: a record that lacks one, or
a binary record made for another spec, is a dead letter with the reason.
- `json` (default): one JSON object per record, readable with any Kafka tool. A batch of values is
  joined into one buffer and parsed by Arrow's multithreaded JSON reader against the explicit
  schema. Only when a batch holds a bad record does decoding fall back to checking records one by
  one, to name the bad ones (dead letters). `event_time` travels as integer microseconds (UTC).
- `binary`: a compact layout (`slipstream.samples.binary_codec`) decoded with numpy views and block
  copies; about half the bytes and a small fraction of the JSON parse's CPU.
Neither builds per-record Python objects on the hot path. `codec_for(spec)` keeps one codec per
spec; `encode_samples` / `decode_samples` take the spec (the default spec when None).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from slipstream.samples.binary_codec import MARKER, OLD_MARKER, BinaryLayout
from slipstream.samples.schema import DEFAULT_SPEC, sample_arrow_schema
from slipstream.samples.spec import EVENT_TIME, LABEL, Spec
from slipstream.settings import KAFKA_CODECS as CODECS

OLD_LAYOUT = "binary sample in the layout of Slipstream before feature specs: produce it again"
MAX_VALUE_BYTES = 64 * 1024
"""A sample larger than this is a dead letter (a runaway sequence feature, a wrong topic)."""


@dataclass
class DecodedBatch:
    table: pa.Table
    """Good rows in the spec's sample schema, in input order."""
    good_index: np.ndarray
    """Index into the input values of each good row."""
    bad: list[tuple[int, str]] = field(default_factory=list)
    """(index into the input values, reason) for each dead letter."""


class SampleCodec:
    """Both value formats of one spec's samples."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.schema = sample_arrow_schema(spec)
        self.columns = tuple(self.schema.names)
        self.dense = tuple(f.name for f in spec.dense)
        self.lists = tuple(f.name for f in spec.lists)
        self.binary = BinaryLayout(spec)
        wire = pa.schema([pa.field(EVENT_TIME, pa.int64()) if f.name == EVENT_TIME else f for f in self.schema])
        self._parse_options = pj.ParseOptions(explicit_schema=wire, unexpected_field_behavior="ignore")

    # --- encode -------------------------------------------------------------------------------
    def encode(self, table: pa.Table, codec: str = "json") -> list[bytes]:
        """Encode sample rows (the spec's columns) as values of `codec` (one of CODECS), one per row."""
        table = table.select(list(self.columns))
        if codec == "binary":
            return self.binary.encode(table)
        if codec != "json":
            raise ValueError(f"unknown sample codec {codec!r}: use one of {', '.join(CODECS)}")
        if table.num_rows == 0:
            return []
        joined = self._json_columnar(table)
        if joined is not None:
            return joined.to_pylist()  # type: ignore[no-any-return]
        cols = {name: table.column(name).to_pylist() for name in self.columns if name != EVENT_TIME}
        cols[EVENT_TIME] = pc.cast(table.column(EVENT_TIME), pa.int64()).to_pylist()
        return [json.dumps({k: cols[k][i] for k in self.columns}, separators=(",", ":")).encode()
                for i in range(table.num_rows)]

    def _json_columnar(self, table: pa.Table) -> pa.Array | None:
        """Every row's JSON object built column by column with Arrow string kernels (no Python
        object per row): numbers as Arrow's shortest round-trip text of their float64 value (what
        `json.dumps` writes, up to notation), lists joined by commas. None when a value needs what
        only `json.dumps` does (a null, a non-finite number, a string needing escapes)."""
        pieces: list[pa.Array | pa.Scalar] = []
        for i, name in enumerate(self.columns):
            col = table.column(name).combine_chunks()
            if col.null_count:
                return None
            typ = col.type
            if pa.types.is_string(typ) or pa.types.is_large_string(typ):
                if pc.any(pc.match_substring_regex(col, r'["\\\x00-\x1f]')).as_py():
                    return None
                text = pc.binary_join_element_wise('"', col, '"', "")
            elif pa.types.is_timestamp(typ):
                text = pc.cast(pc.cast(col, pa.int64()), pa.string())
            elif pa.types.is_list(typ) or pa.types.is_large_list(typ):
                inner = pc.binary_join(pc.cast(col, pa.list_(pa.string())), ",")
                text = pc.binary_join_element_wise("[", inner, "]", "")
            elif pa.types.is_floating(typ):
                if not pc.all(pc.is_finite(col)).as_py():
                    return None
                text = pc.cast(pc.cast(col, pa.float64()), pa.string())
            elif pa.types.is_integer(typ) or pa.types.is_boolean(typ):
                text = pc.cast(col, pa.string())
            else:
                return None
            pieces += [pa.scalar(("{" if i == 0 else ",") + json.dumps(name) + ":"), text]
        pieces.append(pa.scalar("}"))
        return pc.cast(pc.binary_join_element_wise(*pieces, ""), pa.binary())

    # --- decode -------------------------------------------------------------------------------
    def decode(self, values: Sequence[bytes | None]) -> DecodedBatch:
        """Decode a batch of Kafka values (of either codec) into sample columns, separating dead letters."""
        n = len(values)
        binary: np.ndarray
        lengths: np.ndarray
        try:  # one newline join serves both codecs: JSON parses it, binary records are read in place
            buf = b"\n".join(values)  # type: ignore[arg-type]
        except TypeError:  # a None value (a tombstone): look at the values one by one
            binary = np.array([v is not None and len(v) > 0 and v[0] == MARKER for v in values], dtype=np.bool_)
            buf, lengths = b"", np.zeros(n, dtype=np.int64)
        else:
            lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)  # type: ignore[arg-type]
            starts = np.cumsum(lengths + 1) - (lengths + 1)
            binary = lengths > 0
            binary[binary] = np.frombuffer(buf, dtype=np.uint8)[starts[binary]] == MARKER
        if not binary.any():
            return self._decode_json(values, (buf, lengths) if buf else None)
        if not binary.all() or not buf:  # a mixed batch: each codec decodes its records
            return _merge([(np.flatnonzero(binary), self.decode), (np.flatnonzero(~binary), self._decode_json)], values)
        bad = [(int(i), _oversize(int(lengths[i]))) for i in np.flatnonzero(lengths > MAX_VALUE_BYTES)]
        fit = np.flatnonzero(lengths <= MAX_VALUE_BYTES)
        table, good, more = self.binary.decode(buf, starts[fit], lengths[fit])
        return DecodedBatch(table, fit[good], sorted(bad + [(int(fit[j]), r) for j, r in more]))

    def _parse(self, buf: bytes) -> pa.Table:
        return pj.read_json(io.BytesIO(buf), parse_options=self._parse_options)

    def _check_row(self, obj: object) -> str | None:
        if not isinstance(obj, dict):
            return "value is not a JSON object"
        for name in self.columns:
            if obj.get(name) is None:
                return f"missing required field {name!r}"
        for name in self.dense:
            v = obj[name]
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                return f"field {name!r} is not a finite number: {v!r}"
        if obj[LABEL] not in (0, 1):
            return f"field 'label' must be 0 or 1, got {obj[LABEL]!r}"
        for name in self.lists:
            if not isinstance(obj[name], list):
                return f"field {name!r} is not a list"
        return None

    def _validate_table(self, t: pa.Table) -> np.ndarray:
        """Row mask of rows with every field present, finite dense features and a 0/1 label."""
        ok = np.ones(t.num_rows, dtype=bool)
        for name in self.columns:
            ok &= ~t.column(name).is_null().to_numpy(zero_copy_only=False)
        for name in self.dense:
            vals = t.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
            ok &= np.isfinite(np.nan_to_num(vals, nan=np.nan))
        lab = t.column(LABEL).fill_null(-1).to_numpy(zero_copy_only=False)
        ok &= (lab == 0) | (lab == 1)
        return ok

    def _to_samples(self, t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index(EVENT_TIME)
        t = t.set_column(i, EVENT_TIME, pc.cast(t.column(EVENT_TIME), pa.timestamp("us", tz="UTC")))
        return t.select(list(self.columns)).cast(self.schema)

    def _decode_json(self, values: Sequence[bytes | None], joined: tuple[bytes, np.ndarray] | None = None) -> DecodedBatch:
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
            elif v[0] == OLD_MARKER:
                bad.append((i, OLD_LAYOUT))
            elif b"\n" in v:
                bad.append((i, "value contains a newline: not a single JSON object"))
            else:
                keep.append(i)
        idx = np.asarray(keep, dtype=np.int64)
        if len(keep) == 0:
            return DecodedBatch(self.schema.empty_table(), idx, bad)
        try:
            if buf is None:
                buf = b"\n".join(values[i] for i in keep)  # type: ignore[misc]
            parsed = self._parse(buf)
            if parsed.num_rows != len(keep):
                raise pa.ArrowInvalid("row count mismatch")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return self._decode_slow(values, keep, bad)
        ok = self._validate_table(parsed)
        if not ok.all():
            for j in np.flatnonzero(~ok):
                reason = self._reason(values[keep[j]])  # type: ignore[arg-type]
                bad.append((keep[j], reason or "invalid field value"))
            parsed = parsed.filter(pa.array(ok))
            idx = idx[ok]
        bad.sort()
        return DecodedBatch(self._to_samples(parsed), idx, bad)

    def _reason(self, value: bytes) -> str | None:
        if value[:1] == bytes([OLD_MARKER]):
            return OLD_LAYOUT
        try:
            obj = json.loads(value)
        except (ValueError, UnicodeDecodeError) as e:
            return f"not valid JSON: {e}"
        return self._check_row(obj)

    def _decode_slow(self, values: Sequence[bytes | None], keep: list[int], bad: list[tuple[int, str]]) -> DecodedBatch:
        good: list[int] = []
        for i in keep:
            v = values[i]
            assert v is not None
            reason = self._reason(v)
            if reason is None:
                try:
                    self._parse(v)
                except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                    reason = f"wrong field type: {e}"
            if reason is None:
                good.append(i)
            else:
                bad.append((i, reason))
        bad.sort()
        idx = np.asarray(good, dtype=np.int64)
        if not good:
            return DecodedBatch(self.schema.empty_table(), idx, bad)
        parsed = self._parse(b"\n".join(values[i] for i in good))  # type: ignore[misc]
        return DecodedBatch(self._to_samples(parsed), idx, bad)


_CODECS: dict[str, SampleCodec] = {}


def codec_for(spec: Spec | None = None) -> SampleCodec:
    """The codec of a spec (the default spec's for None), built once per spec."""
    spec = spec or DEFAULT_SPEC
    codec = _CODECS.get(spec.digest)
    if codec is None:
        codec = _CODECS[spec.digest] = SampleCodec(spec)
    return codec


def encode_samples(table: pa.Table, codec: str = "json", spec: Spec | None = None) -> list[bytes]:
    """Encode sample rows of `spec` (default spec: None) as values of `codec`, one per row."""
    return codec_for(spec).encode(table, codec)


def decode_samples(values: Sequence[bytes | None], spec: Spec | None = None) -> DecodedBatch:
    """Decode a batch of values of either codec into `spec`'s sample columns, naming dead letters."""
    return codec_for(spec).decode(values)


def _join_if_all_plain(values: Sequence[bytes | None], joined: tuple[bytes, np.ndarray] | None = None) -> bytes | None:
    """The values joined by newlines when none is empty, None, over MAX_VALUE_BYTES or holds a
    newline (what the per-record screen in `_decode_json` checks); else None.
    `joined`: that join and the value lengths, when the caller has them."""
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


def _merge(parts: list[tuple[np.ndarray, Callable[[list[bytes | None]], DecodedBatch]]],
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
