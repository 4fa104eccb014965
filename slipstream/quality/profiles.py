"""Mergeable per-column profiles of sample data: what TFDV calls statistics, built to add up.

A `FeatureProfile` of a day merges with the profiles of other days into the profile of the
window, and the trainer's profile of what it read from Kafka (`profile_table`) compares with it
column by column. Counts, null counts, min/max, mean and variance (Chan's parallel update),
sequence-length histograms and CTR per hour merge exactly; the quantile sketch (`LogHistogram`)
and distinct-count sketch (`HyperLogLog`) merge to exactly the sketch of the union; top-k
categories are exact while a column has at most `TopK.capacity` distinct values. How a column
is profiled follows its feature's kind in the spec (`column_kinds`: dense numbers, hashed
categoricals, ids, list lengths).
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.quality.column_kernels import (
    distinct_values,
    float_min_max,
    list_length_counts,
    numpy_chunks,
    small_int_counts,
    value_counts,
)
from slipstream.quality.hashing import hash_column
from slipstream.quality.sketches import HyperLogLog, LogHistogram, TopK
from slipstream.samples.spec import EVENT_TIME, LABEL, SAMPLE_ID, Spec

PROFILE_VERSION = 1
US_PER_HOUR = 3_600_000_000

KINDS = ("numeric", "categorical", "id", "sequence", "time", "key")
PARALLEL_MIN_ROWS = 200_000
"""Below this, thread start-up costs more than profiling columns side by side saves."""
PROFILE_THREADS = 1
"""Columns profiled side by side. 1 by default: on the 2-core dev machine, threads made a 5M-row
profile slower (0.8-1.3 s vs 0.6 s serial; memory-bound numpy passes). The gate runs the
column jobs next to its duplicate-id check on its own threads (`gate.GATE_THREADS`). Raise it
on machines with cores to spare."""


def run_parallel(jobs: list[Callable[[], Any]], parallel: bool = True, threads: int | None = None) -> list[Any]:
    """Run independent jobs on up to `threads` (default PROFILE_THREADS) threads: numpy and
    Arrow kernels release the GIL. Each job owns its own column state (no shared writes)."""
    workers = min(len(jobs), PROFILE_THREADS if threads is None else threads, os.cpu_count() or 1)
    if not parallel or workers <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="profile") as pool:
        return [f.result() for f in [pool.submit(job) for job in jobs]]


FEATURE_KINDS = {"dense": "numeric", "categorical": "categorical", "id": "id", "list": "sequence", "sequence": "sequence"}
"""A spec feature's kind -> how its column is profiled (lists and sequences by their lengths)."""
RESERVED_KINDS = {SAMPLE_ID: "key", EVENT_TIME: "time", LABEL: "numeric"}
"""The columns every spec has; the label is numeric, so its mean is the CTR."""


def column_kinds(spec: Spec) -> dict[str, str]:
    """How each sample column of `spec` is profiled, from its feature's kind."""
    return {**RESERVED_KINDS, **{f.name: FEATURE_KINDS[f.kind] for f in spec.features}}


def column_kind(name: str, dtype: pa.DataType) -> str:
    """How a column outside the spec's kinds is profiled: the columns every spec has by name, any
    other by its Arrow type."""
    if name in RESERVED_KINDS:
        return RESERVED_KINDS[name]
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return "sequence"
    if pa.types.is_timestamp(dtype):
        return "time"
    if pa.types.is_floating(dtype):
        return "numeric"
    if pa.types.is_integer(dtype) or pa.types.is_dictionary(dtype):
        return "categorical"
    return "key"


@dataclass
class ColumnProfile:
    """Counts every column kind has; `values` are the rows where the column is not null."""

    kind: str
    rows: int = 0
    nulls: int = 0
    nonfinite: int = 0
    """NaN or ±inf (numeric columns only): present but unusable."""
    count: int = 0
    """Finite, non-null values seen by the moments and sketches."""
    min: float | None = None
    max: float | None = None
    mean: float = 0.0
    m2: float = 0.0
    """Sum of squared deviations from the mean (variance = m2 / count)."""
    hist: LogHistogram | None = None
    hll: HyperLogLog | None = None
    topk: TopK | None = None
    lengths: dict[int, int] = field(default_factory=dict)
    """Sequence columns: list length -> rows."""

    @classmethod
    def empty(cls, kind: str) -> ColumnProfile:
        if kind not in KINDS:
            raise ValueError(f"unknown column kind {kind!r}; expected one of {KINDS}")
        return cls(
            kind=kind,
            hist=LogHistogram() if kind == "numeric" else None,
            hll=HyperLogLog() if kind in ("categorical", "id") else None,
            topk=TopK() if kind == "categorical" else None,
        )

    @property
    def null_fraction(self) -> float:
        return (self.nulls + self.nonfinite) / self.rows if self.rows else 0.0

    @property
    def variance(self) -> float:
        return self.m2 / self.count if self.count else float("nan")

    def distinct(self) -> float:
        """Distinct non-null values: exact from top-k while it is exact, else the HLL estimate."""
        if self.topk is not None and self.topk.exact:
            return float(len(self.topk.counts))
        return self.hll.estimate() if self.hll is not None else float("nan")

    def _add_moments(self, x: np.ndarray) -> None:
        if len(x) == 0:
            return
        n_b = len(x)
        mean_b = float(x.mean())
        m2_b = float(np.square(x - mean_b).sum())
        lo, hi = float(x.min()), float(x.max())
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)
        self.mean, self.m2, self.count = _combine_moments(self.count, self.mean, self.m2, n_b, mean_b, m2_b)

    def _add_moments_counted(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Moments of integer values given as ascending distinct `keys` and their `counts`."""
        n_b = int(counts.sum())
        if n_b == 0:
            return
        mean_b = float((keys * counts).sum() / n_b)
        m2_b = float((np.square(keys - mean_b) * counts).sum())
        self.min = float(keys[0]) if self.min is None else min(self.min, float(keys[0]))
        self.max = float(keys[-1]) if self.max is None else max(self.max, float(keys[-1]))
        self.mean, self.m2, self.count = _combine_moments(self.count, self.mean, self.m2, n_b, mean_b, m2_b)

    def _add_moments_arrow(self, x: pa.Array | pa.ChunkedArray, min_max: tuple[float, float] | None = None) -> None:
        """Moments with Arrow's single-pass kernels (double accumulators, no float64 copy);
        `min_max` when the caller already knows them."""
        n_b = len(x)
        if n_b == 0:
            return
        if min_max is None:
            mm = pc.min_max(x).as_py()
            min_max = float(mm["min"]), float(mm["max"])
        mean_b = float(pc.mean(x).as_py())
        m2_b = float(pc.variance(x, ddof=0).as_py()) * n_b
        lo, hi = min_max
        self.min = lo if self.min is None else min(self.min, lo)
        self.max = hi if self.max is None else max(self.max, hi)
        self.mean, self.m2, self.count = _combine_moments(self.count, self.mean, self.m2, n_b, mean_b, m2_b)

    def update(self, arr: pa.Array | pa.ChunkedArray, sketches: bool = True) -> None:
        """Add the values of `arr`. `sketches=False` leaves out what is sketched value by value (a
        float column's quantile buckets, a category's or id's distinct-count sketch and top-k) for a
        caller that fills those in itself (`day_profiles.profile_window`); everything else is added
        as usual."""
        n = len(arr)
        nulls = arr.null_count
        self.rows += n
        self.nulls += nulls
        valid = pc.drop_null(arr) if nulls else arr
        if self.kind == "numeric":
            if pa.types.is_floating(valid.type):
                finite = pc.is_finite(valid)
                n_finite = int(pc.sum(finite).as_py() or 0)
                if n_finite < len(valid):
                    self.nonfinite += len(valid) - n_finite
                    valid = pc.filter(valid, finite)
            assert self.hist is not None
            if pa.types.is_float32(valid.type) and len(valid):
                # float32 features: buckets per cell of float32 bit patterns, chunk by chunk
                # (no concatenated copy), min/max by numpy
                chunks = numpy_chunks(valid)
                self._add_moments_arrow(valid, float_min_max(valid, chunks))
                if sketches:
                    self.hist.add_float32(chunks)
                return
            counted = small_int_counts(valid)
            if counted is not None:
                # small-range integers (labels): moments and buckets follow exactly from the
                # count of each value, one bincount per chunk
                self._add_moments_counted(*counted)
                self.hist.add_counted(*counted)
            else:
                self._add_moments_arrow(valid)
                if sketches:
                    self.hist.add(valid.to_numpy())
        elif self.kind in ("categorical", "id"):
            self.count += len(valid)
            assert self.hll is not None
            if not sketches:
                return
            if self.topk is not None:
                # A sketch of a set depends only on its distinct values: hash those, not every row.
                values, counts = value_counts(valid)
                self.hll.add_hashes(hash_column(values))
                self.topk.add_counts(values.to_pylist(), counts.tolist())
            else:
                # Ids repeat (users, items): sketching the distinct ids is cheaper than every row.
                self.hll.add_hashes(hash_column(distinct_values(valid)))
        elif self.kind == "sequence":
            keys, counts = list_length_counts(valid)
            if len(keys) == 0:
                return
            # One counting pass per chunk; moments and quantiles follow exactly from the length
            # counts, so sequences need no quantile sketch.
            for k, c in zip(keys, counts):
                self.lengths[int(k)] = self.lengths.get(int(k), 0) + int(c)
            self._add_moments_counted(keys, counts)
        elif self.kind == "time":
            self.count += len(valid)
            if len(valid):
                us = pc.cast(valid, pa.int64())
                mm = pc.min_max(us).as_py()
                self.min = mm["min"] if self.min is None else min(self.min, mm["min"])
                self.max = mm["max"] if self.max is None else max(self.max, mm["max"])
        else:
            self.count += len(valid)

    def merge(self, other: ColumnProfile) -> ColumnProfile:
        if other.kind != self.kind:
            raise ValueError(f"cannot merge a {self.kind} column profile with a {other.kind} one")
        mean, m2, count = _combine_moments(self.count, self.mean, self.m2, other.count, other.mean, other.m2)
        if self.kind in ("categorical", "id", "time", "key"):
            mean, m2 = 0.0, 0.0
        lengths = dict(self.lengths)
        for k, c in other.lengths.items():
            lengths[k] = lengths.get(k, 0) + c
        return ColumnProfile(
            kind=self.kind,
            rows=self.rows + other.rows,
            nulls=self.nulls + other.nulls,
            nonfinite=self.nonfinite + other.nonfinite,
            count=self.count + other.count,
            min=_opt(min, self.min, other.min),
            max=_opt(max, self.max, other.max),
            mean=mean,
            m2=m2,
            hist=self.hist.merge(other.hist) if self.hist and other.hist else self.hist or other.hist,
            hll=self.hll.merge(other.hll) if self.hll and other.hll else self.hll or other.hll,
            topk=self.topk.merge(other.topk) if self.topk and other.topk else self.topk or other.topk,
            lengths=lengths,
        )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": self.kind, "rows": self.rows, "nulls": self.nulls, "nonfinite": self.nonfinite,
            "count": self.count, "min": self.min, "max": self.max, "mean": self.mean, "m2": self.m2,
        }
        if self.hist is not None:
            d["hist"] = self.hist.to_dict()
        if self.hll is not None:
            d["hll"] = self.hll.to_dict()
        if self.topk is not None:
            d["topk"] = self.topk.to_dict()
        if self.lengths:
            d["lengths"] = sorted([k, c] for k, c in self.lengths.items())
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ColumnProfile:
        return cls(
            kind=d["kind"], rows=d["rows"], nulls=d["nulls"], nonfinite=d.get("nonfinite", 0),
            count=d["count"], min=d["min"], max=d["max"], mean=d["mean"], m2=d["m2"],
            hist=LogHistogram.from_dict(d["hist"]) if "hist" in d else None,
            hll=HyperLogLog.from_dict(d["hll"]) if "hll" in d else None,
            topk=TopK.from_dict(d["topk"]) if "topk" in d else None,
            lengths={int(k): int(c) for k, c in d.get("lengths", [])},
        )


def _opt(fn: Any, a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else fn(a, b)


def _combine_moments(n_a: int, mean_a: float, m2_a: float, n_b: int, mean_b: float, m2_b: float) -> tuple[float, float, int]:
    """Chan et al.'s pairwise update of (mean, M2): exact up to floating-point rounding."""
    n = n_a + n_b
    if n == 0:
        return 0.0, 0.0, 0
    delta = mean_b - mean_a
    mean = mean_a + delta * n_b / n
    m2 = m2_a + m2_b + delta * delta * n_a * n_b / n
    return mean, m2, n


@dataclass
class FeatureProfile:
    """The profile of a set of sample rows: one `ColumnProfile` per column, plus CTR per hour."""

    rows: int = 0
    columns: dict[str, ColumnProfile] = field(default_factory=dict)
    ctr_by_hour: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Hour (µs since epoch // 3600e6) -> (rows, clicks), when event_time and label are present."""
    kinds: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Column -> kind for columns not profiled yet (`column_kinds(spec)`); a column it does not
    name is profiled by its Arrow type. Not stored: a stored column keeps the kind it was made with."""

    @classmethod
    def for_spec(cls, spec: Spec) -> FeatureProfile:
        """An empty profile whose columns take their kinds from the spec's features."""
        return cls(kinds=column_kinds(spec))

    def update(self, batch: pa.RecordBatch | pa.Table) -> FeatureProfile:
        """Add a batch of rows (in place) and return self."""
        run_parallel(self.update_jobs(batch), parallel=batch.num_rows >= PARALLEL_MIN_ROWS)
        return self

    def update_jobs(self, batch: pa.RecordBatch | pa.Table) -> list[Callable[[], None]]:
        """`update` as independent jobs (one per column, plus CTR), for a caller that runs them
        next to its own work (the gate's duplicate-id check); the profile is complete once
        every job has run."""
        self.rows += batch.num_rows
        jobs: list[Callable[[], None]] = []
        for name in batch.schema.names:
            col = batch.column(name)
            prof = self.columns.get(name)
            if prof is None:
                kind = self.kinds.get(name) or column_kind(name, col.type)
                prof = self.columns[name] = ColumnProfile.empty(kind)
            jobs.append(functools.partial(prof.update, col))
        if EVENT_TIME in batch.schema.names and LABEL in batch.schema.names and batch.num_rows:
            jobs.append(functools.partial(self._add_ctr, batch.column(EVENT_TIME), batch.column(LABEL)))
        return jobs

    def _add_ctr(self, ts: Any, label: Any) -> None:
        if ts.null_count or label.null_count:
            ok = pc.and_(pc.is_valid(ts), pc.is_valid(label))
            ts, label = pc.filter(ts, ok), pc.filter(label, ok)
        if len(ts) == 0:
            return
        us = pc.cast(ts, pa.int64())
        bounds = pc.min_max(us).as_py()
        lo = bounds["min"] // US_PER_HOUR
        hours = bounds["max"] // US_PER_HOUR - lo + 1
        labels = pc.min_max(label).as_py()
        if pa.types.is_integer(label.type) and 0 <= labels["min"] and labels["max"] <= 1:
            # 0/1 labels: one count over (hour, label) pairs per aligned chunk of the two
            # columns, computed in one reused buffer (no concatenated copies, no page faults)
            pairs = np.zeros(2 * hours, dtype=np.int64)
            batches = [b for b in pa.Table.from_arrays([us, label], ["t", "y"]).to_batches() if b.num_rows]
            buf = np.empty(max(b.num_rows for b in batches), dtype=np.int64)
            for batch in batches:
                key = buf[: batch.num_rows]
                np.floor_divide(batch.column(0).to_numpy(), US_PER_HOUR, out=key)
                key -= lo
                key <<= 1
                key += batch.column(1).to_numpy()
                pairs += np.bincount(key, minlength=2 * hours)
            k = pairs[1::2]
            n = pairs[0::2] + k
        else:
            h = us.to_numpy() // US_PER_HOUR - lo
            n = np.bincount(h, minlength=hours)
            k = np.bincount(h, weights=label.to_numpy().astype(np.float64), minlength=hours)
        for i in np.flatnonzero(n):
            h = lo + int(i)
            rows, pos = self.ctr_by_hour.get(h, (0, 0))
            self.ctr_by_hour[h] = (rows + int(n[i]), pos + int(round(k[i])))

    def merge(self, other: FeatureProfile) -> FeatureProfile:
        cols = {name: ColumnProfile.from_dict(p.to_dict()) for name, p in self.columns.items()}
        for name, p in other.columns.items():
            cols[name] = cols[name].merge(p) if name in cols else ColumnProfile.from_dict(p.to_dict())
        ctr = dict(self.ctr_by_hour)
        for h, (n, k) in other.ctr_by_hour.items():
            a, b = ctr.get(h, (0, 0))
            ctr[h] = (a + n, b + k)
        return FeatureProfile(self.rows + other.rows, cols, ctr, {**other.kinds, **self.kinds})

    @property
    def ctr(self) -> float:
        lab = self.columns.get(LABEL)
        return lab.mean if lab is not None and lab.count else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PROFILE_VERSION,
            "rows": self.rows,
            "columns": {name: p.to_dict() for name, p in sorted(self.columns.items())},
            "ctr_by_hour": sorted([h, n, k] for h, (n, k) in self.ctr_by_hour.items()),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureProfile:
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(
                f"profile version {d.get('version')!r} is not {PROFILE_VERSION}: re-profile the data "
                "(`slipstream quality profile --day D`)"
            )
        return cls(
            rows=int(d["rows"]),
            columns={name: ColumnProfile.from_dict(p) for name, p in d["columns"].items()},
            ctr_by_hour={int(h): (int(n), int(k)) for h, n, k in d.get("ctr_by_hour", [])},
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=True)

    @classmethod
    def from_json(cls, text: str) -> FeatureProfile:
        return cls.from_dict(json.loads(text))

    def write(self, path: Path | str) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, path: Path | str) -> FeatureProfile:
        return cls.from_json(Path(path).read_text())


def profile_table(table: pa.Table | pa.RecordBatch, spec: Spec) -> FeatureProfile:
    """Profile a table of `spec`'s samples (any subset of its columns)."""
    return FeatureProfile.for_spec(spec).update(table)


def profile_batches(batches: Iterable[pa.RecordBatch | pa.Table], spec: Spec) -> FeatureProfile:
    prof = FeatureProfile.for_spec(spec)
    for b in batches:
        prof.update(b)
    return prof


def merge_profiles(profiles: Iterable[FeatureProfile]) -> FeatureProfile:
    out = FeatureProfile()
    for p in profiles:
        out = out.merge(p)
    return out


def describe(profile: ColumnProfile) -> dict[str, float]:
    """A few headline numbers of a column for tables and logs."""
    out = {"rows": float(profile.rows), "null_fraction": profile.null_fraction}
    if profile.kind in ("numeric", "sequence") and profile.count:
        out.update(mean=profile.mean, std=math.sqrt(profile.variance), min=float(profile.min or 0), max=float(profile.max or 0))
    if profile.kind in ("categorical", "id"):
        out["distinct"] = profile.distinct()
    return out
