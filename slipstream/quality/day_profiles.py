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

`profile_window` also gives the profile of the whole table from the same pass (the gate's
window profile): the sketches of the whole are the sums and maxima of the groups' counts and
registers, and only moments and counts are computed again over the whole column.
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
    """Which group (day) each row belongs to."""

    days: list[date]
    index: np.ndarray
    """Per row (table order): the position of its group; the days of `days` come first, then at
    most one group of the rows of no wanted day (`profile_window` only)."""
    rows: np.ndarray
    """Rows per group."""
    order: np.ndarray | None
    """The rows in group order (stable), or None when the table is in that order already."""

    @property
    def n(self) -> int:
        return len(self.rows)

    def in_day_order(self, col: pa.ChunkedArray) -> pa.Array:
        """The column as one array, its rows in group order."""
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        return arr if self.order is None else arr.take(pa.array(self.order))


def profile_days(data: pa.Table, spec: Spec, days: Iterable[date]) -> dict[date, FeatureProfile]:
    """The profile of each of `days` that has rows in `data` (rows of other days are ignored):
    for each, what `profile_table(rows of that day, spec)` gives."""
    return _profile(data, spec, days, whole=False)[0]


def profile_window(data: pa.Table, spec: Spec, days: Iterable[date]) -> tuple[dict[date, FeatureProfile], FeatureProfile]:
    """`profile_days(data, spec, days)` and `profile_table(data, spec)` (every row, of any day or
    none) from one pass over each column, both exactly as those give them.

    The grouped pass already has what the whole table's sketches are made of: its quantile
    buckets are the buckets of every finite value, its distinct-count registers the highest
    rank of each slot over the groups, its top-k the sum of each value's counts per group, all
    counted before any top-k is trimmed. Moments, counts and min/max are the whole column's own
    (`ColumnProfile.update(col, sketches=False)`: Arrow's kernels over the rows in table order,
    the same float operations as `profile_table`), so every bit matches. The rows of no wanted
    day (already profiled, outside the days, or without an event time) are one more group that
    only the whole table's profile sees."""
    per_day, window = _profile(data, spec, days, whole=True)
    assert window is not None
    return per_day, window


def _profile(data: pa.Table, spec: Spec, days: Iterable[date],
             whole: bool) -> tuple[dict[date, FeatureProfile], FeatureProfile | None]:
    kinds = column_kinds(spec)
    window = FeatureProfile(kinds=kinds) if whole else None
    if data.num_rows == 0:
        if window is not None:
            window.update(data)
        return {}, window
    time_col = data.column(EVENT_TIME)
    timed = np.asarray(pc.is_valid(time_col).to_numpy(zero_copy_only=False), dtype=bool) if time_col.null_count else None
    numbers = day_numbers(time_col.fill_null(0) if timed is not None else time_col)
    wanted = np.array(sorted({(d - EPOCH).days for d in days}), dtype=np.int64)
    keep = np.isin(numbers, wanted)
    if timed is not None:
        keep &= timed
    rest = int(len(keep) - np.count_nonzero(keep))
    if rest and not whole:
        data, numbers, keep = data.filter(pa.array(keep)), numbers[keep], keep[keep]
    if not keep.any():
        if window is not None:
            window.update(data)
        return {}, window
    lo = int(numbers[keep].min())
    span = int(numbers[keep].max()) - lo + 1
    # rows of no wanted day count in group `span` (after every day), which no day keeps
    per_number = np.bincount(np.where(keep, numbers - lo, span), minlength=span + 1)
    present = np.flatnonzero(per_number[:span])
    slot = np.full(span + 1, len(present), dtype=np.int64)
    slot[present] = np.arange(len(present))
    index = slot[np.where(keep, numbers - lo, span)]
    sizes = per_number[present] if not (whole and rest) else np.append(per_number[present], rest)
    in_order = bool((index[1:] >= index[:-1]).all())
    g = _Days([EPOCH + timedelta(days=lo + int(k)) for k in present], index, sizes,
              None if in_order else np.argsort(index, kind="stable"))

    profiles = [FeatureProfile(rows=int(n), kinds=kinds) for n in g.rows]
    if window is not None:
        window.rows = data.num_rows
    for name in data.schema.names:
        col = data.column(name)
        kind = kinds.get(name) or column_kind(name, col.type)
        per_group, whole_col = _column(kind, col, g, whole)
        for prof, cp in zip(profiles, per_group):
            prof.columns[name] = cp
        if window is not None and whole_col is not None:
            window.columns[name] = whole_col
    if EVENT_TIME in data.schema.names and LABEL in data.schema.names:
        ctr = window if window is not None else FeatureProfile()
        ctr._add_ctr(data.column(EVENT_TIME), data.column(LABEL))
        first = (g.days[0] - EPOCH).days
        position = {(d - EPOCH).days - first: i for i, d in enumerate(g.days)}
        for h, counts in sorted(ctr.ctr_by_hour.items()):
            i = position.get(h * US_PER_HOUR // US_PER_DAY - first)
            if i is not None:
                profiles[i].ctr_by_hour[h] = counts
    return dict(zip(g.days, profiles)), window


def _column(kind: str, col: pa.ChunkedArray, g: _Days, whole: bool) -> tuple[list[ColumnProfile], ColumnProfile | None]:
    """The column's profile per group, and (`whole`) over every row."""
    valid = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=bool) if col.null_count else None
    nulls = np.zeros(g.n, dtype=np.int64) if valid is None else np.bincount(g.index[~valid], minlength=g.n)
    out = [ColumnProfile.empty(kind) for _ in range(g.n)]
    for cp, n, k in zip(out, g.rows, nulls):
        cp.rows, cp.nulls = int(n), int(k)
    window = ColumnProfile.empty(kind) if whole else None
    t = col.type
    done, sketched = True, False
    if kind == "numeric" and (pa.types.is_float32(t) or pa.types.is_float64(t)):
        _floats(out, col, valid, g, window)
        sketched = True
    elif kind == "numeric" and pa.types.is_integer(t):
        done = _small_ints(out, col, valid, g)
    elif kind in ("categorical", "id") and (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)):
        _distinct(out, col, valid, g, window)
        sketched = True
    elif kind == "sequence" and (pa.types.is_list(t) or pa.types.is_large_list(t)):
        _sequences(out, col, valid, g)
    elif kind == "time" and pa.types.is_timestamp(t):
        _times(out, col, valid, g)
    elif kind == "key":
        for cp in out:
            cp.count = cp.rows - cp.nulls
    else:
        done = False
    if not done:
        out = _day_by_day(kind, col, g)
    if window is not None:
        # the sketches the grouped pass filled in stay; the rest is the whole column's own
        window.update(col, sketches=not (done and sketched))
    return out, window


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


def _floats(out: list[ColumnProfile], col: pa.ChunkedArray, valid: np.ndarray | None, g: _Days,
            window: ColumnProfile | None) -> None:
    """Finite values: min/max by a reduction per day, Arrow's mean and variance on each day's
    values in row order (as on the day alone), histogram buckets per (day, bucket); `window`
    gets the buckets of every value."""
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
    _histograms(out, xv.astype(np.float64), dv, g.n, window)


def _histograms(out: list[ColumnProfile], x: np.ndarray, day: np.ndarray, n_days: int, window: ColumnProfile | None) -> None:
    """Each day's `LogHistogram` of its finite values `x`, as `LogHistogram.add` files them;
    `window`'s of all of them."""
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
    if window is not None:
        assert window.hist is not None
        window.hist.zero = int(zeros.sum())
    negative = (x if everything else x[big]) < 0 if signed else None
    sides = ((None, True),) if negative is None else ((~negative, True), (negative, False))
    for side, positive in sides:
        if side is not None and not side.any():
            continue
        picked = (d, keys) if side is None else (d[side], keys[side])
        days, bucket, counts = _pairs(*picked, n_days)
        for cp, (k, c) in zip(out, _by_day(days, bucket, counts, n_days)):
            if len(k):
                assert cp.hist is not None
                (cp.hist.positive if positive else cp.hist.negative).update(zip(k.tolist(), c.tolist()))
        if window is not None and len(bucket):
            assert window.hist is not None
            k, where = np.unique(bucket, return_inverse=True)
            c = np.bincount(where, weights=counts, minlength=len(k)).astype(np.int64)
            (window.hist.positive if positive else window.hist.negative).update(zip(k.tolist(), c.tolist()))


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


def _distinct(out: list[ColumnProfile], col: pa.ChunkedArray, valid: np.ndarray | None, g: _Days,
              window: ColumnProfile | None) -> None:
    """Categories and ids: each value's hash once, the per-day HLL registers by one scatter-max
    over the rows; categories also count each value per day for their top-k. `window` gets the
    registers and (untrimmed) counts of every row."""
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
    if window is not None:
        assert window.hll is not None
        window.hll.registers = registers.max(axis=0)
    if out and out[0].topk is not None:
        values = encoded.dictionary.to_pylist()
        for cp, (keys, counts) in zip(out, _by_day(days, seen, tallies, g.n)):
            assert cp.topk is not None
            cp.topk.counts = dict(zip([values[k] for k in keys.tolist()], counts.tolist()))
            cp.topk._prune()
        if window is not None and window.topk is not None:
            each = np.bincount(codes, minlength=len(values))
            keys = np.flatnonzero(each)
            window.topk.add_counts([values[k] for k in keys.tolist()], each[keys].tolist())


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
