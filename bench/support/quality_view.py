"""Flat bench keys from a run's typed metrics (`slipstream.pipeline.run_metrics`): every AUC with
its 95% interval (`_ci`, a bootstrap over users) and the rows it was computed on (`_rows`)."""

from __future__ import annotations

from typing import Any

from slipstream.pipeline.run_metrics import AucScore, Difference, EvalSet, RunMetrics


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def auc_keys(prefix: str, s: AucScore | None) -> dict[str, Any]:
    if s is None:
        return {prefix: None, f"{prefix}_ci": None}
    return {prefix: _r(s.auc), f"{prefix}_ci": [_r(s.lo), _r(s.hi)] if s.has_interval else None}


def diff_keys(prefix: str, d: Difference | None) -> dict[str, Any]:
    if d is None:
        return {prefix: None, f"{prefix}_ci": None}
    return {prefix: _r(d.diff), f"{prefix}_ci": [_r(d.lo), _r(d.hi)] if d.has_interval else None}


def set_keys(name: str, s: EvalSet | None, *, models: tuple[str, ...] = ("model", "baseline", "batch_only", "best"),
             suffix: str = "") -> dict[str, Any]:
    """`<name>_auc<suffix>` (the model), `baseline_<name>_auc<suffix>`, `batch_only_...`, `best_...`,
    each with `_ci`, and `<name>_rows`."""
    out: dict[str, Any] = {f"{name}_rows": s.rows if s is not None else 0}
    for m in models:
        key = f"{name}_auc{suffix}" if m == "model" else f"{m}_{name}_auc{suffix}"
        out.update(auc_keys(key, getattr(s, m) if s is not None else None))
    return out


def quality_keys(m: RunMetrics) -> dict[str, Any]:
    """The model-quality keys of a run: the prequential stream (with its lift over the batch-only
    model), the forward tail (what decides promotion), the interleaved hold-out after T and the
    hold-out before T, each next to the logistic baseline on the same rows."""
    ev = m.evaluation
    pre, tail = ev.prequential, ev.forward_tail
    out: dict[str, Any] = {}
    out.update(set_keys("prequential", pre, suffix="_after_t"))
    out["prequential_users"] = pre.users if pre is not None else 0
    out.update(diff_keys("prequential_lift", pre.vs_batch_only if pre is not None else None))
    out.update(diff_keys("prequential_vs_baseline", pre.vs_baseline if pre is not None else None))
    out.update(set_keys("forward_tail", tail))
    out.update(diff_keys("forward_tail_vs_baseline", tail.vs_baseline if tail is not None else None))
    out.update(set_keys("holdout_after_t", ev.holdout_after_t))
    out.update(set_keys("holdout_before_t", ev.holdout_before_t))
    out.update(set_keys("validation", ev.validation, models=("model", "baseline")))
    hold = ev.holdout_after_t.rows if ev.holdout_after_t is not None else 0
    out["prequential_rows_vs_interleaved_holdout"] = round(out["prequential_rows"] / hold, 2) if hold else None
    out["auc_on"] = m.auc_on
    return out
