"""The profile of each day of a window, in one grouped pass per column.

`profile_days(data, spec, days)` gives exactly what `profile_table` gives on each day's rows (the
gate stores one profile per day of a window it checks: 200 days are 200 profiles). Profiling the
days one by one costs a few hundred microseconds of Python per day and column however few the
rows; here every column is read once: each row carries the index of its day, and counts, distinct
values, sketch registers, list lengths and histogram buckets are counted per (day, value) in one
bincount or one scatter over the whole window. Only what depends on the order of the values
(Arrow's mean and variance of a float column) is still computed day by day, on zero-copy slices
of the column in day order, so the sums add up in the same order as on the day alone. Column
types without a grouped path (floats as categories, dictionary columns...) are profiled day by
day, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.quality.hashing import hash_column
from slipstream.quality.profiles import US_PER_HOUR, ColumnProfile, FeatureProfile, column_kind, column_kinds
from slipstream.quality.sketches import HyperLogLog
from slipstream.samples.spec import EVENT_TIME, LABEL, Spec

US_PER_DAY = 86_400_000_000
EPOCH = date(1970, 1, 1)
MAX_DENSE_CELLS = 1 << 22
"""(day, value) pairs are counted in a dense table up to this many cells, else by a sort."""


def day_numbers(event_time: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Days since 1970-01-01 (UTC) of each row's event time (a column without nulls)."""
    us = np.asarray(pc.cast(event_time, pa.int64()).to_numpy(), dtype=np.int64)
    return np.floor_divide(us, US_PER_DAY)


@dataclass
class _Days:
    """Which day each row belongs to."""

    days: list[date]
    index: np.ndarray
    """Per row (table order): the position of its day in `days`."""
    rows: np.ndarray
    """Rows per day."""
    order: np.ndarray | None
    """The rows in day order (stable), or None when the table is in day order already."""

    @property
    def n(self) -> int:
        return len(self.days)

    def in_day_order(self, col: pa.ChunkedArray) -> pa.Array:
        """The column as one array, its rows in day order."""
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        return arr if self.order is None else arr.take(pa.array(self.order))


def profile_days(data: pa.Table, spec: Spec, days: Iterable[date]) -> dict[date, FeatureProfile]:
    """The profile of each of `days` that has rows in `data` (rows of other days are ignored):
    for each, what `profile_table(rows of that day, spec)` gives."""
    if data.num_rows == 0:
        return {}
    if data.column(EVENT_TIME).null_count:  # rows without a time belong to no day
        data = data.filter(pc.is_valid(data.column(EVENT_TIME)))
    numbers = day_numbers(data.column(EVENT_TIME))
    wanted = np.array(sorted({(d - EPOCH).days for d in days}), dtype=np.int64)
    keep = np.isin(numbers, wanted)
    if not keep.all():
        data, numbers = data.filter(pa.array(keep)), numbers[keep]
        if data.num_rows == 0:
            return {}
    lo = int(numbers.min())
    per_number = np.bincount(numbers - lo)
    present = np.flatnonzero(per_number)
    slot = np.zeros(len(per_number), dtype=np.int64)
    slot[present] = np.arange(len(present))
    index = slot[numbers - lo]
    in_order = bool((index[1:] >= index[:-1]).all())
    g = _Days([EPOCH + timedelta(days=lo + int(k)) for k in present], index, per_number[present],
              None if in_order else np.argsort(index, kind="stable"))

    kinds = column_kinds(spec)
    profiles = [FeatureProfile(rows=int(n), kinds=kinds) for n in g.rows]
    for name in data.schema.names:
        col = data.column(name)
        kind = kinds.get(name) or column_kind(name, col.type)
        for prof, cp in zip(profiles, _column(kind, col, g)):
            prof.columns[name] = cp
    if EVENT_TIME in data.schema.names and LABEL in data.schema.names:
        whole = FeatureProfile()
        whole._add_ctr(data.column(EVENT_TIME), data.column(LABEL))
        first = (g.days[0] - EPOCH).days
        position = {(d - EPOCH).days - first: i for i, d in enumerate(g.days)}
        for h, counts in sorted(whole.ctr_by_hour.items()):
            profiles[position[h * US_PER_HOUR // US_PER_DAY - first]].ctr_by_hour[h] = counts
    return dict(zip(g.days, profiles))


def _column(kind: str, col: pa.ChunkedArray, g: _Days) -> list[ColumnProfile]:
    valid = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool) if col.null_count else None
    nulls = np.zeros(g.n, dtype=np.int64) if valid is None else np.bincount(g.index[~valid], minlength=g.n)
    out = [ColumnProfile.empty(kind) for _ in range(g.n)]
    for cp, n, k in zip(out, g.rows, nulls):
        cp.rows, cp.nulls = int(n), int(k)
    t = col.type
    done = True
    if kind == "numeric" and (pa.types.is_float32(t) or pa.types.is_float64(t)):
        _floats(out, col, valid, g)
    elif kind == "numeric" and pa.types.is_integer(t):
        done = _small_ints(out, col, valid, g)
    elif kind in ("categorical", "id") and (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        _distinct(out, col, valid, g)
    elif kind == "sequence" and (pa.types.is_list(t) or pa.types.is_large_list(t)):
        _sequences(out, col, valid, g)
    elif kind == "time" and pa.types.is_timestamp(t):
        _times(out, col, valid, g)
    elif kind == "key":
        for cp in out:
            cp.count = cp.rows - cp.nulls
    else:
        done = False
    return out if done else _day_by_day(kind, col, g)


def _day_by_day(kind: str, col: pa.ChunkedArray, g: _Days) -> list[ColumnProfile]:
    """The column profiled one day at a time (types without a grouped path)."""
    arr = g.in_day_order(col)
    bounds = np.concatenate([[0], np.cumsum(g.rows)])
    out = []
    for i in range(g.n):
        cp = ColumnProfile.empty(kind)
        cp.update(pa.chunked_array([arr.slice(int(bounds[i]), int(g.rows[i]))], type=col.type))
        out.append(cp)
    return out


def _days_of(g: _Days, valid: np.ndarray | None) -> np.ndarray:
    """The day index of each non-null row."""
    return g.index if valid is None else g.index[valid]


def _pairs(day: np.ndarray, key: np.ndarray, n_days: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (day, integer key) pairs of the rows, by day then key: (days, keys, rows with each)."""
    if len(key) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    lo = int(key.min())
    span = int(key.max()) - lo + 1
    code = day * span
    code += key
    if lo:
        code -= lo
    if n_days * span <= MAX_DENSE_CELLS:
        table = np.bincount(code, minlength=n_days * span)
        codes = np.flatnonzero(table)
        counts = table[codes]
    else:
        codes, counts = np.unique(code, return_counts=True)
    days, keys = np.divmod(codes, span)
    return days, keys + lo, counts


def _counts_by_day(day: np.ndarray, key: np.ndarray, n_days: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each day, (ascending distinct integer keys, rows with each) of the rows of that day."""
    days, keys, counts = _pairs(day, key, n_days)
    return _by_day(days, keys, counts, n_days)


def _by_day(days: np.ndarray, keys: np.ndarray, counts: np.ndarray, n_days: int) -> list[tuple[np.ndarray, np.ndarray]]:
    cuts = np.searchsorted(days, np.arange(n_days + 1)).tolist()
    return [(keys[a:b], counts[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


def _floats(out: list[ColumnProfile], col: pa.ChunkedArray, valid: np.ndarray | None, g: _Days) -> None:
    """Finite values: min/max by a reduction per day, Arrow's mean and variance on each day's
    values in row order (as on the day alone), histogram buckets per (day, bucket)."""
    x = np.asarray(col.to_numpy())  # nulls read as NaN, and `valid` leaves them out
    finite = np.isfinite(x)
    nonfinite = np.bincount(g.index[~finite if valid is None else valid & ~finite], minlength=g.n)
    ok = finite if valid is None else finite & valid
    # the finite values in day order: one gather (the rows of a day keep their order)
    rows = np.flatnonzero(ok) if g.order is None else g.order[ok[g.order]]
    xv, dv = x[rows], g.index[rows]
    values = pa.array(xv, type=col.type)
    n = np.bincount(dv, minlength=g.n)
    starts = np.concatenate([[0], np.cumsum(n)[:-1]])
    has = np.flatnonzero(n)
    lows = np.minimum.reduceat(xv, starts[has]) if len(has) else xv[:0]
    highs = np.maximum.reduceat(xv, starts[has]) if len(has) else xv[:0]
    for cp, k in zip(out, nonfinite):
        cp.nonfinite = int(k)
    for j, i in enumerate(has.tolist()):
        part = pa.chunked_array([values.slice(int(starts[i]), int(n[i]))], type=col.type)
        lo, hi = float(lows[j]), float(highs[j])
        if lo == 0 or hi == 0:  # which zero (0.0 or -0.0) Arrow returns depends on the rows' order
            mm = pc.min_max(part).as_py()
            lo, hi = float(mm["min"]), float(mm["max"])
        out[i]._add_moments_arrow(part, (lo, hi))
    _histograms(out, xv.astype(np.float64), dv, g.n)


def _histograms(out: list[ColumnProfile], x: np.ndarray, day: np.ndarray, n_days: int) -> None:
    """Each day's `LogHistogram` of its finite values `x`, as `LogHistogram.add` files them."""
    ref = out[0].hist
    assert ref is not None
    signed = bool(len(x)) and float(x.min()) < 0
    mag = np.abs(x) if signed else x
    big = mag >= ref.min_value
    everything = bool(big.all())
    zeros = np.zeros(n_days, dtype=np.int64) if everything else np.bincount(day[~big], minlength=n_days)
    keys = ref._keys(mag if everything else mag[big])
    d = day if everything else day[big]
    for cp, z in zip(out, zeros):
        assert cp.hist is not None
        cp.hist.zero = int(z)
    negative = (x if everything else x[big]) < 0 if signed else None
    sides = ((None, True),) if negative is None else ((~negative, True), (negative, False))
    for side, positive in sides:
        if side is not None and not side.any():
            continue
        picked = (d, keys) if side is None else (d[side], keys[side])
        for cp, (k, c) in zip(out, _counts_by_day(*picked, n_days)):
            if len(k):
                assert cp.hist is not None
                (cp.hist.positive if positive else cp.hist.negative).update(zip(k.tolist(), c.tolist()))


def _small_ints(out: list[ColumnProfile], col: pa.ChunkedArray, valid: np.ndarray | None, g: _Days) -> bool:
    """Integer numbers of at most 32 bits whose range stays small (labels, flags): moments and
    buckets from the count of each value per day, as `small_int_counts` gives them on a day.
    False (nothing done) for other integers."""
    if col.type.bit_width > 32:
        return False
    v = np.asarray(pc.drop_null(col).to_numpy() if col.null_count else col.to_numpy(), dtype=np.int64)
    if len(v) and int(v.max()) - int(v.min()) > 1 << 16:
        return False  # some day might count it differently: leave it to the day-by-day path
    for cp, (keys, counts) in zip(out, _counts_by_day(_days_of(g, valid), v, g.n)):
        if len(keys):
            cp._add_moments_counted(keys, counts)
            assert cp.hist is not None
            cp.hist.add_counted(keys, counts)
    return True


def _distinct(out: list[ColumnProfile], col: pa.ChunkedArray, valid: np.ndarray | None, g: _Days) -> None:
    """Categories and ids: each value's hash once, the per-day HLL registers by one scatter-max
    over the rows; categories also count each value per day for their top-k."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    encoded = pc.dictionary_encode(pc.drop_null(arr) if arr.null_count else arr)
    codes = np.asarray(encoded.indices.to_numpy(), dtype=np.int64)
    day = _days_of(g, valid)
    count = np.bincount(day, minlength=g.n)
    # each (day, value) once: the registers take the highest rank of each day's distinct values
    days, seen, tallies = _pairs(day, codes, g.n)
    hll = HyperLogLog()
    idx, rank = hll.slots(hash_column(encoded.dictionary))
    registers = np.zeros((g.n, hll.m), dtype=np.uint8)
    if len(seen):
        np.maximum.at(registers.reshape(-1), days * hll.m + idx[seen], rank[seen].astype(np.uint8))
    for cp, c, regs in zip(out, count, registers):
        cp.count = int(c)
        assert cp.hll is not None
        cp.hll.registers = regs
    if out and out[0].topk is not None:
        values = encoded.dictionary.to_pylist()
        for cp, (keys, counts) in zip(out, _by_day(days, seen, tallies, g.n)):
            assert cp.topk is not None
            cp.topk.counts = dict(zip([values[k] for k in keys.tolist()], counts.tolist()))
            cp.topk._prune()


def _sequences(out: list[ColumnProfile], col: pa.ChunkedArray, valid: np.ndarray | None, g: _Days) -> None:
    """List lengths per day, from the offsets (no copy of the values)."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    parts = [np.diff(np.asarray(c.offsets.to_numpy(), dtype=np.int64)) for c in chunks if len(c)]
    lengths = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if valid is not None:
        lengths = lengths[valid]
    for cp, (keys, counts) in zip(out, _counts_by_day(_days_of(g, valid), lengths, g.n)):
        if len(keys):
            cp.lengths = dict(zip(keys.tolist(), counts.tolist()))
            cp._add_moments_counted(keys, counts)


def _times(out: list[ColumnProfile], col: pa.ChunkedArray, valid: np.ndarray | None, g: _Days) -> None:
    us = pc.cast(pc.drop_null(col) if col.null_count else col, pa.int64())
    v = np.asarray(us.to_numpy(), dtype=np.int64)
    day = _days_of(g, valid)
    count = np.bincount(day, minlength=g.n)
    lows = np.full(g.n, np.iinfo(np.int64).max, dtype=np.int64)
    highs = np.full(g.n, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lows, day, v)
    np.maximum.at(highs, day, v)
    for cp, c, lo, hi in zip(out, count, lows, highs):
        cp.count = int(c)
        if c:
            cp.min, cp.max = int(lo), int(hi)
