"""Columnar aggregates the quality suite checks, computed once with pyarrow/numpy.

Great Expectations then validates a one-row frame of these numbers (see `suites`), so its cost
does not grow with the data: the row-level work is vectorised here, and most of it is shared
with the day's `FeatureProfile`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.quality.hashing import hash_strings
from slipstream.quality.profiles import FeatureProfile
from slipstream.samples.schema import ARROW_SCHEMA, CATEGORICAL_COLUMNS, DENSE_FEATURES, LABEL_COLUMN, SEQUENCE_COLUMN


@dataclass
class Aggregates:
    """Metric name -> number, plus human-readable details (example ids, type mismatches)."""

    values: dict[str, float] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)


def schema_problems(schema: pa.Schema) -> list[str]:
    """Each way `schema` differs from the sample schema: missing columns and wrong types."""
    problems = []
    for f in ARROW_SCHEMA:
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
    table: pa.Table, profile: FeatureProfile, start: datetime, end: datetime,
    duplicates: tuple[int, list[str]] | None = None,
) -> Aggregates:
    """Every metric the suite checks, for rows that should all lie in [start, end).
    `duplicates` is `duplicate_ids(sample_id)` when the caller already computed it."""
    agg = Aggregates()
    v = agg.values
    v["row_count"] = float(table.num_rows)
    problems = schema_problems(table.schema)
    v["schema_mismatches"] = float(len(problems))
    if problems:
        agg.details["schema_mismatches"] = "; ".join(problems)
    names = set(table.schema.names)
    for name in ARROW_SCHEMA.names:
        if name in names:
            col = profile.columns[name]
            v[f"nulls.{name}"] = float(col.nulls)
    for f in DENSE_FEATURES:
        if f.name not in names:
            continue
        col = profile.columns[f.name]
        v[f"nonfinite.{f.name}"] = float(col.nonfinite)
        v[f"min.{f.name}"] = col.min if col.min is not None else math.nan
        v[f"max.{f.name}"] = col.max if col.max is not None else math.nan
    for name in ("user_id", "item_id"):
        if name in names and table.num_rows:
            v[f"min.{name}"] = float(pc.min(table.column(name)).as_py() or 0)
    if LABEL_COLUMN in names:
        lab = table.column(LABEL_COLUMN)
        prof = profile.columns.get(LABEL_COLUMN)
        if (
            pa.types.is_integer(lab.type) and prof is not None and prof.rows == table.num_rows
            and (prof.count == 0 or (prof.min is not None and prof.min >= 0 and prof.max is not None and prof.max <= 1))
        ):
            bad = 0  # the profile's exact min/max of an integer label already bound it to {0, 1}
        else:
            bad = pc.sum(pc.invert(pc.is_in(pc.drop_null(lab), pa.array([0, 1], lab.type)))).as_py() or 0
        v["label_not_binary"] = float(bad)
        v["ctr"] = profile.ctr if table.num_rows else math.nan
    if "sample_id" in names:
        surplus, examples = duplicates if duplicates is not None else duplicate_ids(table.column("sample_id"))
        v["duplicate_sample_ids"] = float(surplus)
        if examples:
            agg.details["duplicate_sample_ids"] = "e.g. " + ", ".join(examples)
    if "event_time" in names:
        ts = table.column("event_time")
        t = profile.columns.get("event_time")
        if (
            t is not None and t.kind == "time" and t.rows == table.num_rows
            and pa.types.is_timestamp(ts.type) and ts.type.unit == "us" and _inside(t, start, end)
        ):
            outside = 0  # the profile's exact min/max (non-null rows) both lie in [start, end)
        else:
            lo = pa.scalar(start, ts.type)
            hi = pa.scalar(end, ts.type)
            outside = pc.sum(pc.or_(pc.less(ts, lo), pc.greater_equal(ts, hi))).as_py() or 0
        v["events_outside_interval"] = float(outside)
        if outside:
            t = profile.columns["event_time"]
            agg.details["events_outside_interval"] = (
                f"event_time spans [{_us_iso(t.min)}, {_us_iso(t.max)}], expected "
                f"[{start.isoformat()}, {end.isoformat()})"
            )
    for name in CATEGORICAL_COLUMNS:
        if name in names:
            v[f"distinct.{name}"] = profile.columns[name].distinct()
    if SEQUENCE_COLUMN in names:
        seq = profile.columns[SEQUENCE_COLUMN]
        v["max_history_length"] = float(seq.max) if seq.max is not None else 0.0
        rows = max(seq.rows - seq.nulls, 1)
        v["empty_history_fraction"] = seq.lengths.get(0, 0) / rows
    return agg


def _inside(t: Any, start: datetime, end: datetime) -> bool:
    """Whether a time profile's min and max (µs since the epoch) lie in [start, end): then so
    does every non-null value, and the row-level comparison can be skipped."""
    if t.count == 0:
        return True
    if t.min is None or t.max is None:
        return False
    lo = (start - EPOCH) // timedelta(microseconds=1)
    hi = (end - EPOCH) // timedelta(microseconds=1)
    return lo <= t.min and t.max < hi


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _us_iso(us: Any) -> str:
    if us is None:
        return "none"
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).isoformat()
