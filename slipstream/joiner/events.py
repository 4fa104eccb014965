"""Raw events as the joiner reads them from Kafka: one JSON object per record with the spec
source's fields. The time field is an ISO-8601 string (as in the raw zone: `2026-11-24T10:00:00Z`)
or a number of epoch milliseconds (Kafka's unit). A record that cannot become a row raises
`BadEvent` with the reason that goes with it to the dead-letter topic."""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from slipstream.samples.schema import field_arrow_type, source_arrow_schema
from slipstream.samples.spec import SourceSpec

US_PER_S = 1_000_000


class BadEvent(ValueError):
    """A raw record the joiner cannot use; the message is the dead letter's reason."""


_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "long": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool) and -2**31 <= v < 2**31,
    "double": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "boolean": lambda v: isinstance(v, bool),
}


def time_us(value: Any, name: str) -> int:
    """An event time (ISO-8601 text, or epoch milliseconds) as epoch microseconds."""
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value)
        except ValueError:
            raise BadEvent(f"{name} {value[:40]!r} is not an ISO-8601 time") from None
        if dt.tzinfo is None:
            raise BadEvent(f"{name} {value[:40]!r} has no time zone: write it in UTC with a Z")
        return int(dt.timestamp()) * US_PER_S + dt.microsecond
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return int(value * 1000)
    raise BadEvent(f"{name} must be an ISO-8601 time or epoch milliseconds, got {str(value)[:40]!r}")


def parse_event(value: bytes | None, source: SourceSpec) -> tuple[dict[str, Any], int]:
    """A record's fields (the source's, others dropped) and its event time in epoch microseconds;
    the time field is replaced by the microseconds."""
    row = parse_fields(value, source)
    return row, row[source.time or ""]


def parse_fields(value: bytes | None, source: SourceSpec) -> dict[str, Any]:
    """A record's fields (the source's, others dropped; times as epoch microseconds), checked
    against the source's types; BadEvent names what is wrong."""
    if not value:
        raise BadEvent("empty record")
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        raise BadEvent("not JSON: " + value[:60].decode("utf-8", "replace")) from None
    if not isinstance(doc, dict):
        raise BadEvent(f"not a JSON object with the fields of {source.name}")
    row: dict[str, Any] = {}
    for f in source.fields:
        v = doc.get(f.name)
        if v is None:
            if not f.optional:
                raise BadEvent(f"missing field {f.name}")
            continue
        if f.type == "timestamp":
            v = time_us(v, f.name)
        elif f.is_list:
            if not isinstance(v, list):
                raise BadEvent(f"{f.name} must be a list, got {str(v)[:40]!r}")
        elif not _CHECKS[f.type](v):
            raise BadEvent(f"wrong type: {f.name}={str(v)[:40]} is not a {f.type}")
        row[f.name] = v
    return row


def parse_batch(values: list[bytes], source: SourceSpec) -> pa.Table | None:
    """`parse_event` of every value at once with Arrow's JSON reader (the hot path): the source's
    fields in its Arrow schema (times as UTC timestamps, a missing optional field null), or None
    when any record is not a clean, complete event with ISO times (then the caller parses one by
    one, which names the bad records). The same rows as `parse_event` for the records it accepts."""
    if not values or any(not v or b"\n" in v for v in values):
        return None
    schema = pa.schema([pa.field(f.name, pa.string() if f.type == "timestamp" else field_arrow_type(f.type))
                        for f in source.fields])
    try:
        table = pj.read_json(io.BytesIO(b"\n".join(values)), read_options=pj.ReadOptions(block_size=1 << 26),
                             parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))
        if table.num_rows != len(values):
            return None
        for f in source.fields:
            col = table.column(f.name)
            if not f.optional and col.null_count:
                return None
            if f.type == "double" and len(col) and not pc.all(pc.is_finite(pc.fill_null(col, 0.0))).as_py():
                return None
            if f.type == "timestamp":
                table = table.set_column(table.column_names.index(f.name), f.name, pc.cast(col, pa.timestamp("us", tz="UTC")))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    return table.select([f.name for f in source.fields]).combine_chunks()


def parse_records(values: list[bytes], source: SourceSpec) -> tuple[pa.Table, np.ndarray, list[tuple[int, str]]]:
    """A batch of raw records as (rows of the good ones in the source's Arrow schema, their event
    times in epoch microseconds, (index, reason) of each bad one): one Arrow call when the batch is
    clean, else one `parse_event` per record, which names the bad ones."""
    table = parse_batch(values, source)
    if table is not None:
        return table, event_times(table, source), []
    schema = source_arrow_schema(source)
    rows, bad = [], []
    for i, v in enumerate(values):
        try:
            row = parse_event(v, source)[0]
            rows.append(pa.Table.from_pylist([row], schema=schema))
        except BadEvent as e:
            bad.append((i, str(e)))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:  # e.g. a list of the wrong items
            bad.append((i, f"wrong type: {str(e)[:80]}"))
    table = pa.concat_tables(rows) if rows else schema.empty_table()
    return table, event_times(table, source), bad


def event_times(table: pa.Table, source: SourceSpec) -> np.ndarray:
    """The source's event time column as int64 epoch microseconds."""
    col = pc.cast(table.column(source.time or ""), pa.timestamp("us", tz="UTC"))
    times: np.ndarray = pc.cast(col, pa.int64()).to_numpy()
    return times


def out_of_range(ts: np.ndarray, now_us: int, max_future_s: float, max_age_s: float,
                 kind: str) -> list[tuple[int, str]]:
    """(index, reason) of each event time that cannot be right: more than `max_future_s` ahead of
    the clock (a broken clock would close every window), or more than `max_age_s` behind it
    (1971, a 0 default, seconds written as milliseconds: it would be trained as history that
    never was). `kind` names the event in the reason ("impression", "click")."""
    ahead = ts - now_us > int(max_future_s * US_PER_S)
    behind = now_us - ts > int(max_age_s * US_PER_S) if max_age_s > 0 else np.zeros(len(ts), dtype=bool)
    out = []
    for i in np.flatnonzero(ahead | behind).tolist():
        when = _iso(int(ts[i]))
        if ahead[i]:
            out.append((i, f"event time out of range: {kind} time {when} is {(int(ts[i]) - now_us) / US_PER_S:.0f} s "
                           f"ahead of this machine's clock (more than --max-future-s {max_future_s:g})"))
        else:
            out.append((i, f"event time out of range: {kind} time {when} is {(now_us - int(ts[i])) / 86400e6:.0f} days "
                           f"before this machine's clock (more than --max-age-s {max_age_s:g}): a broken clock, a "
                           "default value or a wrong unit?"))
    return out


def _iso(us: int) -> str:
    try:
        return datetime.fromtimestamp(us / US_PER_S, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return f"{us} us since 1970"
