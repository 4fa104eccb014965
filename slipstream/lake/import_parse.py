"""Raw values -> a spec field's type, with a reason for every value that cannot be used.

`slipstream import` reads text (CSV/TSV cells, JSON values) and typed columns (Parquet); each
field is parsed to its spec type in one vectorised step per batch, and only a batch that holds a
bad value is parsed value by value to name it. A value is either usable, missing (null, an empty
cell: an optional field then takes its default), or bad (with a reason naming the value).

Timestamps: ISO-8601 strings (`2026-11-01T00:00:01.5Z`, `2026-11-01 00:00:01+01:00`; without an
offset they are UTC), or epoch numbers whose unit is told by magnitude: below 1e11 seconds, below
1e14 milliseconds, below 1e17 microseconds, else nanoseconds (so seconds reach the year 5138, and
milliseconds before 1973-03-03 would be read as seconds).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.samples.schema import field_arrow_type
from slipstream.samples.spec import FieldSpec

TS = pa.timestamp("us", tz="UTC")
_UNITS_US = ((1e11, 1_000_000), (1e14, 1_000), (1e17, 1), (math.inf, 0.001))
_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0"}


class BadValue(ValueError):
    """A value that cannot be used; the message is `what: the value` (`reason_kind` keeps `what`)."""


def reason_kind(reason: str) -> str:
    """A reason without its value (`not a number: 'abc'` -> `not a number`), for counting."""
    return reason.split(": ", 1)[0]


@dataclass
class Parsed:
    values: pa.Array
    """The field's type; null where the value is missing or bad."""
    bad: dict[int, str] = field(default_factory=dict)
    """Row -> reason, for the values present but unusable."""


def _show(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str)
    return repr(text[:60] + ("…" if len(text) > 60 else ""))


# --- one value at a time (only for a batch holding a bad value) ------------------------------------


def _to_int(v: Any) -> int:
    if isinstance(v, bool):
        raise BadValue(f"expected an integer: {_show(v)}")
    if isinstance(v, int):
        return v
    x = _to_float(v)
    if x != int(x):
        raise BadValue(f"expected an integer: {_show(v)}")
    return int(x)


def _to_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise BadValue(f"expected a number: {_show(v)}")
    try:
        x = float(v)
    except ValueError:
        raise BadValue(f"not a number: {_show(v)}") from None
    if math.isnan(x):
        raise BadValue("is NaN")
    if math.isinf(x):
        raise BadValue(f"is infinite: {_show(v)}")
    return x


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in _TRUE or s in _FALSE:
        return s in _TRUE
    raise BadValue(f"expected true or false: {_show(v)}")


def _to_str(v: Any) -> str:
    if isinstance(v, (list, dict)):
        raise BadValue(f"expected text: {_show(v)}")
    return v if isinstance(v, str) else json.dumps(v)


def epoch_to_us(x: float) -> int:
    """An epoch number in seconds, milliseconds, microseconds or nanoseconds (told by magnitude) -> µs."""
    for limit, factor in _UNITS_US:
        if abs(x) < limit:
            return int(round(x * factor))
    raise AssertionError("unreachable")


def _to_time(v: Any) -> int:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return epoch_to_us(_to_float(v))
    if isinstance(v, datetime):
        dt = v
    else:
        s = str(v).strip()
        try:
            return epoch_to_us(_to_float(s))
        except BadValue:
            pass
        try:
            dt = datetime.fromisoformat(s)
        except ValueError:
            raise BadValue(f"not a time (ISO-8601 or epoch number): {_show(v)}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.replace(microsecond=0).timestamp()) * 1_000_000 + dt.microsecond


def _to_list(inner: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
    def convert(v: Any) -> list[Any]:
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError:
                raise BadValue(f"not a JSON array: {_show(v)}") from None
        if not isinstance(v, list):
            raise BadValue(f"expected a list: {_show(v)}")
        return [inner(x) for x in v]
    return convert


_CONVERT: dict[str, Callable[[Any], Any]] = {
    "string": _to_str, "long": _to_int, "int": _to_int, "double": _to_float, "boolean": _to_bool,
    "timestamp": _to_time, "list<string>": _to_list(_to_str), "list<long>": _to_list(_to_int),
}


def _one_by_one(fs: FieldSpec, arr: pa.Array) -> Parsed:
    convert = _CONVERT[fs.type]
    out: list[Any] = []
    bad: dict[int, str] = {}
    for i, v in enumerate(arr.to_pylist()):
        if v is None or (isinstance(v, str) and not v.strip() and not fs.type.startswith("list")):
            out.append(None)
            continue
        try:
            out.append(convert(v))
        except BadValue as e:
            bad[i] = str(e)
            out.append(None)
        except (OverflowError, ValueError, TypeError) as e:
            bad[i] = f"unusable value: {_show(v)} ({e})"
            out.append(None)
    typ = field_arrow_type(fs.type)
    if fs.type == "timestamp":
        return Parsed(pa.array(out, pa.int64()).cast(TS), bad)
    try:
        return Parsed(pa.array(out, typ), bad)
    except (pa.ArrowInvalid, OverflowError):  # e.g. beyond int32: name each such value
        keep = []
        for i, v in enumerate(out):
            try:
                pa.array([v], typ)
                keep.append(v)
            except (pa.ArrowInvalid, OverflowError):
                bad[i] = f"out of range for {fs.type}: {_show(v)}"
                keep.append(None)
        return Parsed(pa.array(keep, typ), bad)


# --- a whole batch at once ----------------------------------------------------------------------


def _blank_to_null(arr: pa.Array) -> pa.Array:
    if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
        return arr
    trimmed = pc.utf8_trim_whitespace(arr)
    return pc.if_else(pc.equal(trimmed, ""), pa.scalar(None, arr.type), trimmed)


def _epoch_us(x: pa.Array) -> pa.Array:
    v = np.asarray(pc.fill_null(pc.cast(x, pa.float64()), 0.0).to_numpy(), dtype=np.float64)
    if not np.isfinite(v).all():
        raise ValueError("not finite")
    a = np.abs(v)
    factor = np.select([a < 1e11, a < 1e14, a < 1e17], [1e6, 1e3, 1.0], 1e-3)
    if pa.types.is_integer(x.type):  # exact for integers (no float rounding of big epochs)
        iv = np.asarray(pc.fill_null(x, 0).to_numpy(), dtype=np.int64)
        us = np.where(factor >= 1, iv * factor.astype(np.int64).clip(1), iv // 1000)
    else:
        us = np.round(v * factor).astype(np.int64)
    return pc.if_else(pc.is_null(x), pa.scalar(None, TS), pa.array(us, pa.int64()).cast(TS))


def _vectorised(fs: FieldSpec, arr: pa.Array) -> pa.Array:
    """The whole array converted, or an exception when some value is not usable."""
    t, typ = arr.type, field_arrow_type(fs.type)
    if pa.types.is_null(t):
        return pa.nulls(len(arr), typ)
    text = pa.types.is_string(t) or pa.types.is_large_string(t)
    if fs.type == "timestamp":
        if pa.types.is_timestamp(t):
            return pc.cast(arr, TS)
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            return _epoch_us(arr)
        if text:
            if pc.all(pc.match_substring_regex(pc.fill_null(arr, "0"), r"^[+-]?[0-9]+(\.[0-9]*)?$")).as_py():
                return _epoch_us(pc.cast(arr, pa.float64()) if pc.any(pc.match_substring(arr, ".")).as_py()
                                 else pc.cast(arr, pa.int64()))
            try:
                return pc.cast(arr, TS)
            except pa.ArrowInvalid:
                return pc.cast(pc.cast(arr, pa.timestamp("us")), TS)  # no offset: UTC
        raise ValueError("not a time")
    if fs.type in ("long", "int") and (pa.types.is_floating(t) or pa.types.is_boolean(t)):
        raise ValueError("not an integer type")  # integral floats and the rest: one by one
    if fs.type == "boolean" and text:
        low = pc.utf8_lower(arr)
        if not pc.all(pc.fill_null(pc.is_in(low, pa.array(sorted(_TRUE | _FALSE))), True)).as_py():
            raise ValueError("not booleans")
        return pc.if_else(pc.is_null(low), pa.scalar(None, pa.bool_()), pc.is_in(low, pa.array(sorted(_TRUE))))
    if fs.type == "boolean" and not pa.types.is_boolean(t):
        raise ValueError("not booleans")
    if fs.type == "string" and not (text or pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise ValueError("not text")
    out = pc.cast(arr, typ)
    if fs.type == "double" and not pc.all(pc.fill_null(pc.is_finite(out), True)).as_py():
        raise ValueError("NaN or infinite")
    return out


def parse_field(fs: FieldSpec, arr: pa.Array | pa.ChunkedArray) -> Parsed:
    """The values of one field, converted to its type; blank text counts as missing."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = _blank_to_null(arr)
    try:
        return Parsed(_vectorised(fs, arr))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError, OverflowError):
        return _one_by_one(fs, arr)
