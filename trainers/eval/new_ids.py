"""The stream's new ids, for the run's report: how a spec's managed tables were used, and how the
model did on rows whose ids it had never seen before T.

For each managed table's feature: its rows, the rows in use at the end, the ids admitted, evicted
and expired (over the run, and after T: the map at T is the batch-only snapshot's); then, on the
held-out rows after T (a fixed random share of the stream, never trained on), the share of rows
whose id was **new at T** (it occurs in no sample of the window before T: read from the window's
files, not from the map, so it means the same for a hashed table) with its Wilson interval, and
the model's AUC on those rows and on the others, each with its row count and a 95% interval from a
bootstrap over users; beside it the batch-only model's AUC on the same new-id rows (what the
stream phase taught the model about them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from slipstream.samples.spec import EVENT_TIME, Spec
from slipstream.scoring import UserBootstrap, auc
from trainers.data.rows import Rows
from trainers.data.units import Opener, WorkUnit
from trainers.parallel.dist import Dist

Z95 = 1.959963984540054


def wilson(k: int, n: int) -> list[float]:
    """95% Wilson interval of a share k / n ([nan, nan] without rows)."""
    if n == 0:
        return [math.nan, math.nan]
    p = k / n
    mid = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return [0.0 if k == 0 else max(0.0, mid - half), 1.0 if k == n else min(1.0, mid + half)]


def _json_safe(x: Any) -> Any:
    """NaN (no rows of one class, too few rows for an interval) as null, in lists too."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, list):
        return [_json_safe(v) for v in x]
    return x


def seen_before(query: dict[str, np.ndarray], units: list[WorkUnit], open_file: Opener, start_us: int, t_us: int,
                rank: int, world: int, gather: Callable[[Any], list[Any]]) -> dict[str, np.ndarray]:
    """Collective: for each column's query ids (the same on every rank), whether the id occurs in a
    sample of the window [start_us, t_us). Each rank reads its share of the window's row groups,
    the id columns and event time only; the answers are OR-ed over ranks."""
    seen = {c: np.zeros(len(q), dtype=bool) for c, q in query.items()}
    for unit in units[rank::world] if query else ():
        with open_file(unit.path) as fh:
            pf = pq.ParquetFile(fh)
            present = [c for c in query if c in pf.schema_arrow.names]
            if not present:
                continue
            table = pf.read_row_group(unit.row_group, columns=[EVENT_TIME, *present])
        us = pc.cast(table.column(EVENT_TIME), pa.int64())
        table = table.filter(pc.and_(pc.greater_equal(us, start_us), pc.less(us, t_us)))
        for c in present:
            seen[c] |= np.isin(query[c], table.column(c).to_numpy(zero_copy_only=False))
    if world > 1:
        parts = gather(seen)
        seen = {c: np.logical_or.reduce([p[c] for p in parts]) for c in seen}
    return seen


def _auc_ci(labels: np.ndarray, probs: np.ndarray, groups: np.ndarray) -> tuple[float, list[float]]:
    """AUC and its 95% bootstrap interval over groups (users)."""
    e = UserBootstrap(labels, groups).auc(probs)
    return e.value, [e.lo, e.hi]


def id_tables_report(spec: Spec, stats: dict[str, dict[str, int]], stats_at_t: dict[str, dict[str, int]] | None,
                     ids: dict[str, np.ndarray], new: dict[str, np.ndarray], labels: np.ndarray, probs: np.ndarray,
                     probs_batch_only: np.ndarray | None, groups: np.ndarray) -> dict[str, Any]:
    """metrics.json's `id_tables`: per managed feature, its table's counts and the new-id rows'
    share and AUCs (`ids`, `new`: per feature, the held-out after-T rows' ids and whether each was
    new at T, in the order of `labels` and `probs`)."""
    out: dict[str, Any] = {}
    for name, s in stats.items():
        f = spec.feature(name)
        assert f.managed is not None
        entry: dict[str, Any] = {"table": "managed", **s, "admit_after": f.managed.admit_after,
                                 "eviction": f.managed.eviction, "ttl_days": f.managed.ttl_days}
        if stats_at_t is not None and name in stats_at_t:
            t = stats_at_t[name]
            entry["rows_in_use_at_t"] = t["rows_in_use"]
            entry.update({f"{k}_after_t": s[k] - t[k] for k in ("admitted", "evicted", "expired")})
        if name in new and len(labels):
            is_new = new[name]
            k, n = int(is_new.sum()), len(is_new)
            entry.update(eval_rows_after_t=n, new_at_t_rows=k, new_at_t_share=k / n, new_at_t_share_ci=wilson(k, n),
                         new_at_t_distinct_ids=int(len(np.unique(ids[name][is_new]))))
            for part, mask in (("new", is_new), ("known", ~is_new)):
                a, ci = _auc_ci(labels[mask], probs[mask], groups[mask]) if mask.any() else (math.nan, [math.nan, math.nan])
                entry.update({f"auc_{part}_ids_after_t": a, f"auc_{part}_ids_after_t_ci": ci})
            if probs_batch_only is not None and is_new.any():
                entry["auc_new_ids_after_t_batch_only"] = auc(labels[is_new], probs_batch_only[is_new])
        out[name] = {k: _json_safe(v) for k, v in entry.items()}
    return out


def evaluate_id_tables(spec: Spec, model: Any, batch_only: Any, after: Rows, labels: np.ndarray, probs: np.ndarray,
                       probs_batch_only: np.ndarray | None, groups: np.ndarray, units: list[WorkUnit], open_file: Opener,
                       window_us: tuple[int, int], d: Dist) -> dict[str, Any]:
    """Collective: metrics.json's `id_tables` (nothing without a managed table). `model` and
    `batch_only`: the trained model and the one at T (None without a snapshot); `after`: this
    rank's held-out rows after T, scored into the gathered `labels` and `probs` (rank order)."""
    managed = model.tables.managed
    if not managed:
        return {}
    cols = [f.name for f in spec.sparse]
    ids = {n: np.concatenate(d.gather(after.sparse[:, cols.index(n)])) for n in managed.maps}
    seen = seen_before(ids, units, open_file, window_us[0], window_us[1], d.rank, d.world, d.gather)
    at_t = batch_only.tables.managed.stats() if batch_only is not None else None
    return {"id_tables": id_tables_report(spec, managed.stats(), at_t, ids, {n: ~s for n, s in seen.items()}, labels,
                                          probs, probs_batch_only, groups)}
