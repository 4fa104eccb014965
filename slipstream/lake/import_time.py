"""Times as `slipstream import` reads them: a timestamp field's declared `format`, or a guess that
refuses to guess wrong.

A field may declare `format: epoch_s | epoch_ms | epoch_us | epoch_ns` (an epoch number in that
unit), `iso` (ISO-8601 text) or a strptime pattern (`%y%m%d%H`, UTC unless it has `%z`). Without
one, text is ISO-8601 (no offset: UTC) and a number is an epoch whose unit is told by its size,
accepted only when that reading falls between 1990 and 2100: Avazu's `hour` (`14102100`,
YYMMDDHH) read as seconds would be 1970-06-13, so it is rejected with a reason that names the
format that fits. Integers are scaled exactly (no float on the way); the result is microseconds.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.samples.spec import EPOCH_FORMATS, FieldSpec

TS = pa.timestamp("us", tz="UTC")
PLAUSIBLE_FROM = datetime(1990, 1, 1, tzinfo=UTC)
PLAUSIBLE_TO = datetime(2100, 1, 1, tzinfo=UTC)
"""An epoch number without a declared unit must read as a time in here."""
VALID_FROM = datetime(1900, 1, 1, tzinfo=UTC)
VALID_TO = datetime(2200, 1, 1, tzinfo=UTC)
"""Any time, however written, must lie in here (a declared unit that is wrong lands far outside)."""
_VALID_US = (int(VALID_FROM.timestamp()) * 1_000_000, int(VALID_TO.timestamp()) * 1_000_000)
_LO_S, _HI_S = int(PLAUSIBLE_FROM.timestamp()), int(PLAUSIBLE_TO.timestamp())
_UNITS = (("epoch_s", 1), ("epoch_ms", 1_000), ("epoch_us", 1_000_000), ("epoch_ns", 1_000_000_000))
"""Each epoch unit and how many of it make a second."""
_NUMBER = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")
SUGGESTED_PATTERNS = ("%y%m%d%H", "%Y%m%d%H", "%Y%m%d", "%y%m%d", "%Y%m%d%H%M", "%Y%m%d%H%M%S")
"""Patterns tried on an implausible number to say which `format:` would read it."""
INT64_MAX = (1 << 63) - 1
_WIDTHS = {"%Y": 4, "%y": 2, "%m": 2, "%d": 2, "%H": 2, "%M": 2, "%S": 2, "%%": 1}


def fixed_width(pattern: str) -> int | None:
    """The text length a pattern of fixed-width fields (`%Y%m%d%H`) matches, else None. strptime
    alone accepts `141021` for `%y%m%d%H` (reading the day as 2 and the hour as 1)."""
    width, i = 0, 0
    while i < len(pattern):
        if pattern[i] == "%":
            w = _WIDTHS.get(pattern[i:i + 2])
            if w is None:
                return None
            width, i = width + w, i + 2
        else:
            width, i = width + 1, i + 1
    return width


class BadTime(ValueError):
    """A time that cannot be used; the message is `what: the value`."""


def _show(v: Any) -> str:
    text = str(v)
    return repr(text[:60] + ("…" if len(text) > 60 else ""))


def _iso(us: int) -> str:
    """A time for a message; beyond what datetime holds, its year."""
    try:
        return datetime.fromtimestamp(us / 1e6, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return f"the year {1970 + us // 31_556_952_000_000}"


def exact_number(v: Any) -> int | Decimal:
    """A number (or numeric text) exactly: an int when it is one, else a Decimal; BadTime otherwise."""
    if isinstance(v, bool):
        raise BadTime(f"expected a time: {_show(v)}")
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise BadTime(f"is not finite: {_show(v)}")
        return int(v) if v.is_integer() else Decimal(repr(v))
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else v
    s = str(v).strip()
    if not _NUMBER.match(s):
        raise BadTime(f"not a number: {_show(v)}")
    try:
        return int(s)
    except ValueError:
        d = Decimal(s)
        return int(d) if d == d.to_integral_value() else d


def _scale(x: int | Decimal, per_second: int) -> int:
    """An epoch number in a unit with `per_second` of it per second -> microseconds (exact for ints)."""
    if per_second <= 1_000_000:
        us = x * (1_000_000 // per_second)
        return int(us) if isinstance(us, int) else int(us.to_integral_value())
    return int(x) // (per_second // 1_000_000) if isinstance(x, int) else int((x / (per_second // 1_000_000)).to_integral_value())


def guess_epoch(x: int | Decimal, raw: Any) -> int:
    """An epoch number without a declared unit -> microseconds: the one unit whose reading falls in
    [1990, 2100); BadTime naming the formats that would fit otherwise."""
    for _, per_second in _UNITS:
        if _LO_S * per_second <= x < _HI_S * per_second:
            return _scale(x, per_second)
    raise BadTime(implausible(x, raw))


def implausible(x: int | Decimal, raw: Any) -> str:
    """The reason for a number that is no plausible epoch time in any unit, with the format to declare."""
    seen = f" (as epoch seconds {_iso(_scale(x, 1))})" if -(1 << 40) < x < 1 << 40 else ""
    fits = [p for p in SUGGESTED_PATTERNS if _fits(str(raw).strip(), p)]
    hint = (f"declare the field's format, e.g. `format: '{fits[0]}'` (reads it as {_strptime_iso(str(raw).strip(), fits[0])})"
            if fits else "declare the field's format (epoch_s, epoch_ms, epoch_us, epoch_ns, iso or a strptime pattern)")
    return (f"not a plausible epoch time (1990-2100 in s, ms, µs or ns): {_show(raw)}{seen}: {hint}; "
            "or `format: epoch_s` if that date is right")


def _fits(text: str, pattern: str) -> bool:
    if len(text) != fixed_width(pattern):
        return False
    try:
        t = datetime.strptime(text, pattern).replace(tzinfo=UTC)
    except ValueError:
        return False
    return PLAUSIBLE_FROM <= t < PLAUSIBLE_TO


def _strptime_iso(text: str, pattern: str) -> str:
    return datetime.strptime(text, pattern).replace(tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _from_datetime(dt: datetime) -> int:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.replace(microsecond=0).timestamp()) * 1_000_000 + dt.microsecond


def time_value(fs: FieldSpec, v: Any) -> int:
    """One value of a timestamp field -> epoch microseconds, the field's `format`'s way."""
    us = _time_value(fs, v)
    if not _VALID_US[0] <= us < _VALID_US[1]:
        how = f" read as {fs.format}" if fs.format else ""
        raise BadTime(f"outside 1900-2200: {_show(v)}{how} is {_iso(us)}")
    return us


def _time_value(fs: FieldSpec, v: Any) -> int:
    fmt = fs.format
    if isinstance(v, datetime):
        return _from_datetime(v)
    if fmt in EPOCH_FORMATS:
        per_second = dict(_UNITS)[fmt]
        try:
            return _scale(exact_number(v), per_second)
        except BadTime:
            raise BadTime(f"expected an epoch number in {fmt[6:]} (format: {fmt}): {_show(v)}") from None
    if fmt is not None and fmt != "iso":  # a strptime pattern
        if isinstance(v, (float, bool)) or not isinstance(v, (str, int)):
            raise BadTime(f"expected text matching {fmt!r}: {_show(v)}")
        text = str(v).strip()
        try:
            if fixed_width(fmt) not in (None, len(text)):
                raise ValueError("width")
            return _from_datetime(datetime.strptime(text, fmt))
        except ValueError:
            raise BadTime(f"does not match the format {fmt!r}: {_show(v)}") from None
    if not isinstance(v, str) and fmt == "iso":
        raise BadTime(f"expected ISO-8601 text (format: iso): {_show(v)}")
    if fmt is None:
        try:
            x = exact_number(v)
        except BadTime:
            if not isinstance(v, str):
                raise BadTime(f"expected a time: {_show(v)}") from None
        else:
            return guess_epoch(x, v)
    try:
        return _from_datetime(datetime.fromisoformat(str(v).strip()))
    except ValueError:
        what = "ISO-8601" if fmt == "iso" else "ISO-8601 or an epoch number"
        raise BadTime(f"not a time ({what}): {_show(v)}") from None


# --- a whole array at once (raises ValueError when some value needs a closer look) ---------------


def _int64(x: pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(pc.cast(x, pa.int64()), 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _as_ts(us: np.ndarray, x: pa.Array) -> pa.Array:
    return pc.if_else(pc.is_null(x), pa.scalar(None, TS), pa.array(us, pa.int64()).cast(TS))


def _epoch_array(x: pa.Array, per_second: int | None) -> pa.Array:
    """Numbers -> timestamps: in the declared unit (`per_second`), or the one plausible unit."""
    if pa.types.is_integer(x.type):
        v = _int64(x)  # a uint64 beyond int64 raises here: value by value then
        units = _UNITS if per_second is None else [(None, per_second)]
        us = np.zeros(len(v), dtype=np.int64)
        done = np.asarray(pc.is_null(x).to_numpy(zero_copy_only=False), dtype=bool).copy()
        for _, ps in units:
            ok = ~done if per_second is not None else ~done & (v >= _LO_S * ps) & (v < _HI_S * ps)
            if ps <= 1_000_000:
                if per_second is not None and np.any(np.abs(v[ok]) > INT64_MAX // (1_000_000 // ps)):
                    raise ValueError("overflow")
                us[ok] = v[ok] * (1_000_000 // ps)
            else:
                us[ok] = v[ok] // (ps // 1_000_000)
            done |= ok
        if not done.all():
            raise ValueError("implausible")
        return _as_ts(us, x)
    f = np.asarray(pc.fill_null(pc.cast(x, pa.float64()), 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
    if not np.isfinite(f).all():
        raise ValueError("not finite")
    if per_second is None:
        a = np.abs(f)
        unit = np.select([a < _HI_S, a < _HI_S * 1e3, a < _HI_S * 1e6], [1.0, 1e3, 1e6], 1e9)
        if not ((f >= _LO_S * unit) & (f < _HI_S * unit) | pc.is_null(x).to_numpy(zero_copy_only=False)).all():
            raise ValueError("implausible")
    else:
        unit = np.full(len(f), float(per_second))
    return _as_ts(np.round(f * (1e6 / unit)).astype(np.int64), x)


def time_array(fs: FieldSpec, arr: pa.Array) -> pa.Array:
    """A column of a timestamp field converted at once (its format's way), or ValueError/ArrowInvalid
    (then `time_value` names each bad value)."""
    out = _time_array(fs, arr)
    us = pc.cast(out, pa.int64())
    lo, hi = pc.min_max(us).values()
    if lo.is_valid and (lo.as_py() < _VALID_US[0] or hi.as_py() >= _VALID_US[1]):
        raise ValueError("outside 1900-2200")
    return out


def _time_array(fs: FieldSpec, arr: pa.Array) -> pa.Array:
    t, fmt = arr.type, fs.format
    text = pa.types.is_string(t) or pa.types.is_large_string(t)
    if pa.types.is_timestamp(t):
        return pc.cast(arr, TS)
    per_second = dict(_UNITS).get(fmt or "")
    if fmt is None or per_second is not None:
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            return _epoch_array(arr, per_second)
        if text and pc.all(pc.match_substring_regex(pc.fill_null(arr, "0"), r"^[+-]?[0-9]+$")).as_py():
            return _epoch_array(pc.cast(arr, pa.int64()), per_second)
        if per_second is not None or not text:
            raise ValueError("not an epoch number")
    if not text and not (pa.types.is_integer(t) and fmt not in (None, "iso")):
        raise ValueError("not text")
    if fmt is not None and fmt != "iso":
        text_arr = pc.cast(arr, pa.string())
        width = fixed_width(fmt)
        if width is not None and not pc.all(pc.fill_null(pc.equal(pc.utf8_length(text_arr), width), True)).as_py():
            raise ValueError("width")
        parsed = pc.strptime(text_arr, format=fmt, unit="us", error_is_null=False)
        return pc.cast(parsed, TS)
    try:
        return pc.cast(arr, TS)
    except pa.ArrowInvalid:
        return pc.cast(pc.cast(arr, pa.timestamp("us")), TS)  # no offset: UTC

