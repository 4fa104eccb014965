"""Columnar aggregates the quality suite checks, computed once with pyarrow/numpy.

Great Expectations then validates a one-row frame of these numbers (see `suites`), so its cost
does not grow with the data: the row-level work is vectorised here, and most of it is shared
with the day's `FeatureProfile`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.quality.hashing import hash_strings
from slipstream.quality.profiles import ColumnProfile, FeatureProfile
from slipstream.samples.schema import sample_arrow_schema
from slipstream.samples.spec import EVENT_TIME, LABEL, SAMPLE_ID, Spec


@dataclass
class Aggregates:
    """Metric name -> number, plus human-readable details (example ids, type mismatches)."""

    values: dict[str, float] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)


def schema_problems(schema: pa.Schema, spec: Spec) -> list[str]:
    """Each way `schema` differs from the spec's sample schema: missing columns and wrong types."""
    problems = []
    for f in sample_arrow_schema(spec):
        if f.name not in schema.names:
            problems.append(f"{f.name}: missing")
            continue
        got = schema.field(f.name).type
        if not _normal(got).equals(f.type):
            problems.append(f"{f.name}: {got} (expected {f.type})")
    return problems


def _normal(t: pa.DataType) -> pa.DataType:
    """pyiceberg reads strings and lists as their large (64-bit offset) variants: same values."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_list(t):
        return pa.list_(_normal(t.value_type))
    return t


def duplicate_ids(ids: pa.ChunkedArray | pa.Array, examples: int = 5) -> tuple[int, list[str]]:
    """(number of surplus copies, a few duplicated ids). Hash every id, find the hashes that
    occur more than once (`repeated_hashes`), and confirm the rare candidates on the strings
    themselves, so a hash collision never counts."""
    valid = pc.drop_null(ids)
    # equal strings, equal hashes: the final mixing adds nothing here
    cand = repeated_hashes(hash_strings(valid, finalise=False), overwrite=True)
    if len(cand) == 0:
        return 0, []
    mask = np.isin(hash_strings(valid, finalise=False), cand)  # rare: hash again rather than keep a copy
    sub = pc.filter(valid, pa.array(mask))
    vc = pc.value_counts(sub)
    counts = vc.field("counts").to_numpy()
    dup = counts > 1
    surplus = int((counts[dup] - 1).sum())
    names = [str(v) for v in np.asarray(vc.field("values").to_pylist(), dtype=object)[dup][:examples]]
    return surplus, names


def repeated_hashes(h: np.ndarray, overwrite: bool = False) -> np.ndarray:
    """The distinct values that occur more than once in `h`: sort, then compare neighbours.

    numpy sorts 64-bit integers with a vectorised (AVX2/AVX-512) quicksort: 5M hashes in
    ~55 ms on the 2-core dev machine. A sieve that first dropped the certainly-unique hashes
    through a 64 MB slot table (random writes and reads, a cache miss per row) took ~0.2 s
    for the same 5M, so there is no pre-filter. `overwrite=True` sorts `h` itself (no copy)."""
    if len(h) < 2:
        return h[:0].copy()
    if overwrite:
        h.sort()
        s = h
    else:
        s = np.sort(h)
    return np.unique(s[1:][s[1:] == s[:-1]])


def compute_aggregates(
    table: pa.Table, profile: FeatureProfile, start: datetime, end: datetime, spec: Spec,
    duplicates: tuple[int, list[str]] | None = None, absent: dict[str, int] | None = None,
) -> Aggregates:
    """Every metric the suite of `spec` checks, for rows that should all lie in [start, end).
    `duplicates` is `duplicate_ids(sample_id)` when the caller already computed it; `absent` the
    rows per column of data files written before the spec had it (`read_interval`): their nulls
    are the feature's default to be, not missing values."""
    agg = Aggregates()
    v = agg.values
    v["row_count"] = float(table.num_rows)
    problems = schema_problems(table.schema, spec)
    v["schema_mismatches"] = float(len(problems))
    if problems:
        agg.details["schema_mismatches"] = "; ".join(problems)
    names = set(table.schema.names)
    for name in spec.sample_columns:
        if name in names:
            older = (absent or {}).get(name, 0)
            v[f"nulls.{name}"] = float(profile.columns[name].nulls - older)
            if older:
                agg.details[f"nulls.{name}"] = (
                    f"besides {older:,} rows written before the spec had {name} (they take its default)"
                )
    for f in spec.features:
        if f.name in names:
            _feature_metrics(v, table, profile, f.name, f.kind)
    if LABEL in names:
        v["label_not_binary"] = float(_not_binary(table, profile))
        v["ctr"] = profile.ctr if table.num_rows else math.nan
    if SAMPLE_ID in names:
        surplus, examples = duplicates if duplicates is not None else duplicate_ids(table.column(SAMPLE_ID))
        v["duplicate_sample_ids"] = float(surplus)
        if examples:
            agg.details["duplicate_sample_ids"] = "e.g. " + ", ".join(examples)
    if EVENT_TIME in names:
        _interval_metrics(agg, table, profile, start, end)
    return agg


def _feature_metrics(v: dict[str, float], table: pa.Table, profile: FeatureProfile, name: str, kind: str) -> None:
    col = profile.columns[name]
    if kind == "dense":
        v[f"nonfinite.{name}"] = float(col.nonfinite)
        v[f"min.{name}"] = col.min if col.min is not None else math.nan
        v[f"max.{name}"] = col.max if col.max is not None else math.nan
    elif kind == "id":
        if table.num_rows and pa.types.is_integer(table.schema.field(name).type):
            v[f"min.{name}"] = float(pc.min(table.column(name)).as_py() or 0)
    elif kind == "categorical":
        v[f"distinct.{name}"] = col.distinct()
    elif kind == "sequence":
        v[f"max_length.{name}"] = float(col.max) if col.max is not None else 0.0
        v[f"empty_fraction.{name}"] = col.lengths.get(0, 0) / max(col.rows - col.nulls, 1)


def _not_binary(table: pa.Table, profile: FeatureProfile) -> int:
    lab = table.column(LABEL)
    prof = profile.columns.get(LABEL)
    if (
        pa.types.is_integer(lab.type) and prof is not None and prof.rows == table.num_rows
        and (prof.count == 0 or (prof.min is not None and prof.min >= 0 and prof.max is not None and prof.max <= 1))
    ):
        return 0  # the profile's exact min/max of an integer label already bound it to {0, 1}
    return int(pc.sum(pc.invert(pc.is_in(pc.drop_null(lab), pa.array([0, 1], lab.type)))).as_py() or 0)


def _interval_metrics(agg: Aggregates, table: pa.Table, profile: FeatureProfile, start: datetime, end: datetime) -> None:
    ts = table.column(EVENT_TIME)
    t = profile.columns.get(EVENT_TIME)
    if (
        t is not None and t.kind == "time" and t.rows == table.num_rows
        and pa.types.is_timestamp(ts.type) and ts.type.unit == "us" and _inside(t, start, end)
    ):
        outside = 0  # the profile's exact min/max (non-null rows) both lie in [start, end)
    else:
        lo = pa.scalar(start, ts.type)
        hi = pa.scalar(end, ts.type)
        outside = pc.sum(pc.or_(pc.less(ts, lo), pc.greater_equal(ts, hi))).as_py() or 0
    agg.values["events_outside_interval"] = float(outside)
    if outside:
        t = profile.columns[EVENT_TIME]
        agg.details["events_outside_interval"] = (
            f"event_time spans [{_us_iso(t.min)}, {_us_iso(t.max)}], expected "
            f"[{start.isoformat()}, {end.isoformat()})"
        )


def _inside(t: ColumnProfile, start: datetime, end: datetime) -> bool:
    """Whether a time profile's min and max (µs since the epoch) lie in [start, end): then so
    does every non-null value, and the row-level comparison can be skipped."""
    if t.count == 0:
        return True
    if t.min is None or t.max is None:
        return False
    lo = (start - EPOCH) // timedelta(microseconds=1)
    hi = (end - EPOCH) // timedelta(microseconds=1)
    return lo <= t.min and t.max < hi


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _us_iso(us: Any) -> str:
    if us is None:
        return "none"
    return datetime.fromtimestamp(us / 1e6, tz=UTC).isoformat()
