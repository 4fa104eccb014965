"""Times as the spec says they are written: each declared format, exact integer scaling, and an
undeclared number that reads as no plausible time refused with the format that fits."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from slipstream.lake.import_parse import parse_field
from slipstream.samples.spec import FieldSpec, SpecError, parse_spec_text

UTC = UTC
T = datetime(2026, 11, 1, 8, 0, 0, 123456, tzinfo=UTC)


def _parse(values: list, fmt: str | None = None, typ: pa.DataType | None = None) -> tuple[list, dict[int, str]]:  # type: ignore[type-arg]
    p = parse_field(FieldSpec("t", "timestamp", format=fmt), pa.array(values, typ))
    return p.values.to_pylist(), p.bad


@pytest.mark.parametrize("fmt, value, want", [
    ("epoch_s", 1793520000, T.replace(microsecond=0)), ("epoch_s", "1793520000.123456", T),
    ("epoch_ms", 1793520000123, T.replace(microsecond=123000)), ("epoch_ms", "1793520000123.456", T),
    ("epoch_us", 1793520000123456, T), ("epoch_ns", 1793520000123456789, T), ("epoch_ns", "1793520000123456789", T),
    ("iso", "2026-11-01T08:00:00.123456Z", T), ("iso", "2026-11-01 09:00:00.123456+01:00", T),
    ("%Y%m%d%H%M%S", "20261101080000", T.replace(microsecond=0)),
    ("%d/%m/%Y %H:%M:%S.%f%z", "01/11/2026 09:00:00.123456+0100", T),
])
def test_each_declared_format_reads_the_same_instant(fmt: str, value: object, want: datetime) -> None:
    got, bad = _parse([value], fmt)
    assert bad == {} and got == [want]


def test_undeclared_numbers_are_read_by_their_plausible_unit_exactly() -> None:
    got, bad = _parse([1793520000, 1793520000123, 1793520000123456, 1793520000123456789])
    assert bad == {} and got == [T.replace(microsecond=0), T.replace(microsecond=123000), T, T]
    # MovieLens 100k (1997) and Avazu's day (2014) in epoch seconds are plausible
    want = [datetime(1997, 9, 22, 22, 2, 38, tzinfo=UTC), datetime(2014, 10, 21, tzinfo=UTC)]
    assert _parse(["874965758", "1413849600"])[0] == want


def test_an_implausible_number_is_refused_with_the_format_that_fits() -> None:
    _, bad = _parse(["14102100", "20141021", "42"])
    assert "'14102100' (as epoch seconds 1970-06-13T05:15:00Z): declare the field's format, e.g. `format: '%y%m%d%H'`" in bad[0]
    assert "e.g. `format: '%Y%m%d'` (reads it as 2014-10-21T00:00:00Z)" in bad[1]
    assert "declare the field's format (epoch_s, epoch_ms, epoch_us, epoch_ns, iso or a strptime pattern)" in bad[2]


def test_a_declared_unit_that_is_wrong_lands_outside_1900_2200_and_is_refused() -> None:
    _, bad = _parse([1793520000123], "epoch_s")
    assert bad == {0: "outside 1900-2200: '1793520000123' read as epoch_s is the year 58804"}
    _, bad = _parse(["1793520000"], "iso")
    assert bad == {0: "not a time (ISO-8601): '1793520000'"}
    _, bad = _parse(["14102100", "141021"], "%y%m%d%H")
    assert list(bad) == [1] and "does not match the format '%y%m%d%H'" in bad[1]


def test_integer_fields_never_go_through_float() -> None:
    p = parse_field(FieldSpec("id", "long"), pa.array(["1000009418151094273", "10000169349117863715", "9.0", "1e3", "2.5"]))
    assert p.values.to_pylist() == [1000009418151094273, None, 9, 1000, None]
    assert p.bad[1].startswith("out of range for long (int64): '10000169349117863715'")
    assert p.bad[4] == "expected an integer: '2.5'"
    p = parse_field(FieldSpec("id", "long"), pa.array([2.0**53, 2.0**53 + 2]))
    assert p.values.to_pylist() == [2**53, None] and "beyond 2^53 is no exact integer" in p.bad[1]
    p = parse_field(FieldSpec("id", "long"), pa.array([10000169349117863715, 7], pa.uint64()))
    assert p.values.to_pylist() == [None, 7] and "'10000169349117863715'" in p.bad[0]
    as_text = parse_field(FieldSpec("id", "string"), pa.array([10000169349117863715], pa.uint64()))
    assert as_text.values.to_pylist() == ["10000169349117863715"]


SPEC = """\
spec_version: 1
name: tiny
version: 1
sources:
  events:
    kind: events
    id: event_id
    time: ts
    fields:
      event_id: {type: string}
      ts: {type: timestamp, format: TS_FMT}
      user_id: {type: long, ID_FMT}
label:
  rule: user_id >= 1
features:
  user_id: {kind: id, field: user_id, buckets: 101}
"""


def test_the_spec_refuses_a_format_it_cannot_use() -> None:
    ok = parse_spec_text(SPEC.replace("TS_FMT", "'%y%m%d%H'").replace(", ID_FMT", ""))
    assert ok.events.field("ts").format == "%y%m%d%H"
    with pytest.raises(SpecError, match=r"<spec>:11: sources.events.fields.ts.format: .* is not a valid value here"):
        parse_spec_text(SPEC.replace("TS_FMT", "epoch_seconds").replace(", ID_FMT", ""))
    with pytest.raises(SpecError, match=r"<spec>:12: sources.events.fields.user_id.format: `format` is for timestamp fields"):
        parse_spec_text(SPEC.replace("TS_FMT", "iso").replace("ID_FMT", "format: epoch_s"))
