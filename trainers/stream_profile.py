"""A per-feature summary of the fresh samples read from Kafka (`stream_profile.json`).

TODO(quality): switch to `slipstream.quality.profiles.profile_table` (mergeable FeatureProfile)
once it is on main; until then this writes count/mean/std/min/max per dense feature, distinct
hashed values seen per categorical (capped), label rate and history length, which the insight
report can compare with the batch window. Accumulators are sums, so ranks and resumes merge.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from slipstream.schema import CATEGORICAL_COLUMNS, DENSE_COLUMNS
from trainers.rows import Rows

_MAX_DISTINCT = 1000


def new_profile() -> dict[str, Any]:
    return {
        "rows": 0,
        "label_sum": 0.0,
        "hist_len_sum": 0.0,
        "dense": {c: {"sum": 0.0, "sumsq": 0.0, "min": None, "max": None} for c in DENSE_COLUMNS},
        "categorical": {c: [] for c in CATEGORICAL_COLUMNS},
        "event_us_min": None,
        "event_us_max": None,
    }


def _mn(a: Any, b: float) -> float:
    return b if a is None else min(a, b)


def _mx(a: Any, b: float) -> float:
    return b if a is None else max(a, b)


def add_rows(p: dict[str, Any], rows: Rows) -> None:
    n = len(rows)
    if not n:
        return
    p["rows"] += n
    p["label_sum"] += float(rows.label.sum())
    p["hist_len_sum"] += float(rows.hist_offsets[-1] - rows.hist_offsets[0])
    for j, c in enumerate(DENSE_COLUMNS):
        x = rows.dense[:, j].astype(np.float64)
        d = p["dense"][c]
        d["sum"] += float(x.sum())
        d["sumsq"] += float((x * x).sum())
        d["min"], d["max"] = _mn(d["min"], float(x.min())), _mx(d["max"], float(x.max()))
    for j, c in enumerate(CATEGORICAL_COLUMNS):
        seen = p["categorical"][c]
        if len(seen) < _MAX_DISTINCT:
            p["categorical"][c] = sorted(set(seen) | set(np.unique(rows.cats[:, j])[:_MAX_DISTINCT].tolist()))[:_MAX_DISTINCT]
    p["event_us_min"] = _mn(p["event_us_min"], int(rows.event_us.min()))
    p["event_us_max"] = _mx(p["event_us_max"], int(rows.event_us.max()))


def merge(profiles: list[dict[str, Any]]) -> dict[str, Any]:
    out = new_profile()
    for p in profiles:
        out["rows"] += p["rows"]
        out["label_sum"] += p["label_sum"]
        out["hist_len_sum"] += p["hist_len_sum"]
        for c in DENSE_COLUMNS:
            a, b = out["dense"][c], p["dense"][c]
            a["sum"] += b["sum"]
            a["sumsq"] += b["sumsq"]
            if b["min"] is not None:
                a["min"], a["max"] = _mn(a["min"], b["min"]), _mx(a["max"], b["max"])
        for c in CATEGORICAL_COLUMNS:
            out["categorical"][c] = sorted(set(out["categorical"][c]) | set(p["categorical"][c]))[:_MAX_DISTINCT]
        for k, f in (("event_us_min", _mn), ("event_us_max", _mx)):
            if p[k] is not None:
                out[k] = f(out[k], p[k])
    return out


def summarize(p: dict[str, Any]) -> dict[str, Any]:
    n = max(p["rows"], 1)
    dense = {}
    for c, d in p["dense"].items():
        mean = d["sum"] / n
        dense[c] = {"mean": mean, "std": max(d["sumsq"] / n - mean * mean, 0.0) ** 0.5, "min": d["min"], "max": d["max"]}
    return {
        "source": "kafka",
        "profiler": "trainers.stream_profile (simple summary; quality profiles not available)",
        "rows": p["rows"],
        "label_rate": p["label_sum"] / n,
        "hist_len_mean": p["hist_len_sum"] / n,
        "dense": dense,
        "categorical_distinct": {c: len(v) for c, v in p["categorical"].items()},
        "event_time_min_us": p["event_us_min"],
        "event_time_max_us": p["event_us_max"],
    }
