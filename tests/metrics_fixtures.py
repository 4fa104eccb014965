"""metrics.json as the trainer writes it, for the tests and stand-ins that need a finished run
without training one: built through the typed contract (`slipstream.pipeline.run_metrics`), so a
fake can never drift from what the trainer and the readers agree on."""

from __future__ import annotations

from typing import Any

from slipstream.pipeline.run_metrics import AucScore, Difference, EvalSet, Evaluation, RunMetrics, build_run_metrics


def scored_set(auc: float, *, baseline: float | None = None, rows: int = 1000, users: int = 300,
               half_width: float = 0.01, champion: float | None = None) -> EvalSet:
    """An evaluation set where the model scores `auc` and the baseline (and champion) theirs,
    each difference with an interval of ± `half_width` around it."""
    def score(a: float) -> AucScore:
        return AucScore(auc=a, lo=a - 2 * half_width, hi=a + 2 * half_width, logloss=0.4)

    def diff(d: float) -> Difference:
        return Difference(diff=d, lo=d - half_width, hi=d + half_width)

    return EvalSet(rows=rows, users=users, positives=rows // 5, model=score(auc),
                   baseline=score(baseline) if baseline is not None else None,
                   champion=score(champion) if champion is not None else None,
                   vs_baseline=diff(auc - baseline) if baseline is not None else None,
                   vs_champion=diff(auc - champion) if champion is not None else None)


def run_metrics(run_id: str, *, forward_tail: EvalSet | None = None, validation: EvalSet | None = None,
                champion_run_id: str | None = None, **values: Any) -> RunMetrics:
    """A metrics.json of a finished run: the evaluation sets given, the headline from the forward
    tail (else the validation days), the other keys from `values`."""
    ev = Evaluation(forward_tail=forward_tail, validation=validation, champion_run_id=champion_run_id)
    top, on = (forward_tail, "forward_tail") if forward_tail is not None else (validation, "validation")
    head: dict[str, Any] = {}
    if top is not None and top.model is not None:
        head = {"auc": top.model.auc, "auc_lo": top.model.lo, "auc_hi": top.model.hi, "auc_rows": top.rows,
                "auc_on": on, "logloss": top.model.logloss,
                "baseline_auc": top.baseline.auc if top.baseline is not None else None}
    return build_run_metrics({"run_id": run_id, "evaluation": ev, **head, **values})
