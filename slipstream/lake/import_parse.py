"""Raw values -> a spec field's type, with a reason for every value that cannot be used.

`slipstream import` reads text (CSV/TSV cells, JSON values) and typed columns (Parquet); each
field is parsed to its spec type in one vectorised step per batch, and only a batch that holds a
bad value is parsed value by value to name it. A value is either usable, missing (null, an empty
cell: an optional field then takes its default), or bad (with a reason naming the value).

Integers are exact end to end: text is parsed as an integer (`3.0` and `1e3` through `Decimal`),
never through a float, and a value outside the field's range is rejected quoting the text as
written (`10000169349117863715` does not fit `long`; declare the field `string` to keep it as an
id). A floating-point column (Parquet, JSON floats) is accepted for an integer field only where a
float holds the integer exactly (|x| <= 2^53). Timestamps follow the field's `format`
(`slipstream.lake.import_time`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from slipstream.lake.import_time import TS, BadTime, time_array, time_value
from slipstream.samples.schema import field_arrow_type
from slipstream.samples.spec import FieldSpec

EXACT_FLOAT_INT = 1 << 53
"""Beyond this a float64 no longer holds every integer: such a float is no exact integer."""
INT_RANGES = {"long": (-(1 << 63), (1 << 63) - 1), "int": (-(1 << 31), (1 << 31) - 1)}
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
    """An integer exactly: ints as they are, text parsed as an integer (or through Decimal for
    `3.0` / `1e3`), floats only where a float holds the integer exactly."""
    if isinstance(v, bool):
        raise BadValue(f"expected an integer: {_show(v)}")
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise BadValue("is NaN" if math.isnan(v) else f"is infinite: {_show(v)}")
        if not v.is_integer():
            raise BadValue(f"expected an integer: {_show(v)}")
        if abs(v) > EXACT_FLOAT_INT:
            raise BadValue(f"a floating-point number beyond 2^53 is no exact integer: {_show(v)} (write the "
                           "column as integers or as text)")
        return int(v)
    if isinstance(v, Decimal):
        d = v
    elif isinstance(v, str):
        s = v.strip()
        try:
            return int(s)
        except ValueError:
            pass
        try:
            d = Decimal(s)
        except InvalidOperation:
            raise BadValue(f"not a number: {_show(v)}") from None
    else:
        raise BadValue(f"expected an integer: {_show(v)}")
    if d.is_nan():
        raise BadValue("is NaN")
    if d.is_infinite():
        raise BadValue(f"is infinite: {_show(v)}")
    if d != d.to_integral_value():
        raise BadValue(f"expected an integer: {_show(v)}")
    return int(d)


def _to_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str, Decimal)):
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
    return v if isinstance(v, str) else str(v) if isinstance(v, Decimal) else json.dumps(v)


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
    "list<string>": _to_list(_to_str), "list<long>": _to_list(_to_int),
}


def _converter(fs: FieldSpec) -> Callable[[Any], Any]:
    if fs.type != "timestamp":
        return _CONVERT[fs.type]

    def convert(v: Any) -> int:
        try:
            return time_value(fs, v)
        except BadTime as e:
            raise BadValue(str(e)) from None
    return convert


def _one_by_one(fs: FieldSpec, arr: pa.Array) -> Parsed:
    convert = _converter(fs)
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
        except (ArithmeticError, ValueError, TypeError) as e:
            bad[i] = f"unusable value: {_show(v)} ({e})"
            out.append(None)
    typ = field_arrow_type(fs.type)
    if fs.type == "timestamp":
        return Parsed(pa.array(out, pa.int64()).cast(TS), bad)
    if fs.type in INT_RANGES:  # the text as written names a value beyond the type
        lo, hi = INT_RANGES[fs.type]
        raw = arr.to_pylist()
        for i, v in enumerate(out):
            if v is not None and not lo <= v <= hi:
                bad[i] = f"out of range for {fs.type} ({'int64' if fs.type == 'long' else 'int32'}): {_show(raw[i])}" + (
                    " (declare the field `type: string` to keep it as an id)" if fs.type == "long" else "")
                out[i] = None
    return Parsed(pa.array(out, typ), bad)


# --- a whole batch at once ----------------------------------------------------------------------


def _blank_to_null(arr: pa.Array) -> pa.Array:
    if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
        return arr
    trimmed = pc.utf8_trim_whitespace(arr)
    return pc.if_else(pc.equal(trimmed, ""), pa.scalar(None, arr.type), trimmed)


def _vectorised(fs: FieldSpec, arr: pa.Array) -> pa.Array:
    """The whole array converted, or an exception when some value is not usable."""
    t, typ = arr.type, field_arrow_type(fs.type)
    if pa.types.is_null(t):
        return pa.nulls(len(arr), typ)
    text = pa.types.is_string(t) or pa.types.is_large_string(t)
    if fs.type == "timestamp":
        return time_array(fs, arr)
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
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError, OverflowError, ArithmeticError):
        return _one_by_one(fs, arr)
