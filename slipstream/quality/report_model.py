"""The report's run and model sections: the summary's facts, the model against its baselines and
the champion on every evaluation set (`slipstream.quality.evaluation_report`: rows, users and
intervals, the prequential curve, the forward-tail decision), the promotion, freshness, and the
training curve (always drawn when the run logged anything). The model's numbers come from the
typed metrics.json (`slipstream.pipeline.run_metrics.RunMetrics`); the rest reads its keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slipstream.pipeline.run_metrics import SET_TITLES, AucScore, RunMetrics
from slipstream.quality import evaluation_report, plots
from slipstream.quality.report_doc import Finding, ReportDoc
from slipstream.quality.wording import auc, difference, finite, rate, rows, share


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _auc_of(score: AucScore | None, n: int | None = None) -> str:
    if score is None:
        return "–"
    return auc(score.auc, n, (score.lo, score.hi) if score.has_interval else None)


def model_finding(m: RunMetrics) -> Finding | None:
    """The model against its logistic baseline on the rows the headline AUC comes from."""
    head = m.headline
    if head is None or head.model is None or not finite(head.model.auc):
        return None
    on = m.auc_on or ""
    d = head.vs_baseline
    words, verdict = difference(d.diff if d is not None else None, (d.lo, d.hi) if d is not None and d.has_interval else None,
                                head.rows, "its logistic baseline")
    text = f"Model: {_auc_of(head.model, head.rows)} ({SET_TITLES.get(on, on)}), {words}."
    return Finding("Model", text, {"better": True, "worse": False, "unclear": None}[verdict],
                   "Do not promote it: check the features and the training knobs (epochs, learning rate) against "
                   "the baseline's." if verdict == "worse" else "", "model")


def promotion_finding(decision: dict[str, Any] | None, model: Finding | None) -> Finding | None:
    """The registry's decision in its own words; red when it promoted a model its own numbers do
    not show better than its baseline."""
    if not decision:
        return None
    promoted = bool(decision.get("promoted"))
    text = f"Promotion: {'PROMOTED' if promoted else 'not promoted'}: {decision.get('reason', '')}"
    if promoted and model is not None and model.ok is not True:
        return Finding("Promotion", text + " (the model is not shown better than its baseline on these rows)", False,
                       "Keep the champion: judge the run on more rows (a longer stream phase) before serving it.", "model")
    return Finding("Promotion", text, True if promoted else None, anchor="model")


def summary_facts(m: dict[str, Any], t: RunMetrics) -> list[tuple[str, str]]:
    """The run's headline numbers, each with its unit and rows (`m`: metrics.json's keys, `t`: the
    same parsed by its contract)."""
    out: list[tuple[str, str]] = []
    if "window_start" in m and "t_handoff" in m:
        out.append(("training window", f"{m['window_start']} to T = {m['t_handoff']}"
                    + (f" (snapshot {m['snapshot_id']})" if "snapshot_id" in m else "")))
    if "samples_iceberg" in m or "samples_kafka" in m:
        out.append(("rows trained", f"{rows(m.get('samples_iceberg', 0))} from Iceberg, {rows(m.get('samples_kafka', 0))} "
                                    "from Kafka (per epoch and phase, every rank)"))
    head = t.headline
    if finite(t.logloss) and head is not None:
        out.append(("logloss", f"{t.logloss:.4f} on {rows(head.rows)} ({SET_TITLES.get(t.auc_on or '', t.auc_on)})"))
    if head is not None and head.best is not None and head.best.auc is not None:
        # "best achievable" only where its interval is narrower than the gap it explains
        out.append(("best achievable", f"{_auc_of(head.best, head.rows)} (the generator's hidden model on the same rows)"
                    if head.best_is_informative() else "not shown: its interval is wider than the gap to the model"))
    if m.get("chosen_epoch") is not None:
        out.append(("epoch kept", f"epoch {m['chosen_epoch']} of {m.get('epochs_run', '?')} run "
                                  f"(at most {m.get('epochs', '?')})"))
    if finite(m.get("samples_per_s")):
        out.append(("throughput", f"{rate(m['samples_per_s'])}; {share(m.get('data_wait_share'))} of the training time "
                                  "waiting for data"))
    if m.get("checkpoint"):
        out.append(("checkpoint", str(m["checkpoint"])))
    return out


def freshness_section(doc: ReportDoc, m: dict[str, Any], t: RunMetrics) -> None:
    doc.h2("Freshness", "freshness")
    if m:
        lag = m.get("kafka_lag_at_stop")
        f = t.freshness
        live = f.live_prequential
        doc.table([
            ("newest event time trained on", m.get("newest_event_time") or "unknown"),
            ("Kafka lag at stop", f"{lag:,.0f} records" if finite(lag) else "unknown"),
            ("handoff time T", m.get("t_handoff", "unknown")),
            ("event → exported model, p50 / p99", f"{_seconds(f.event_to_export_s_p50)} / {_seconds(f.event_to_export_s_p99)} "
                                                  f"over {f.exports} export(s)"),
            ("live model's prequential AUC (since the previous export)",
             _auc_of(live.model, live.rows) if live is not None else "–"),
        ])
    else:
        doc.p("unknown (no metrics.json)", "muted")
    doc.end()


def _seconds(x: float | None) -> str:
    return f"{x:,.1f} s" if finite(x) else "–"


def model_section(doc: ReportDoc, t: RunMetrics, model: Finding | None, promotion: Finding | None,
                  decision: dict[str, Any] | None) -> None:
    """The model on every evaluation set against its baselines and the champion, the validation
    curve; then the prequential curve and the forward-tail decision."""
    if t.auc_on is None and not t.validation_curve:
        return
    doc.h2("Model, baselines and evaluation sets", "model")
    if model is not None:
        doc.finding(model)
    evaluation_report.evaluation_table(doc, t)
    _validation(doc, t)
    doc.end()
    evaluation_report.prequential_section(doc, t)
    evaluation_report.decision_section(doc, t, decision, promotion)


def _validation(doc: ReportDoc, t: RunMetrics) -> None:
    curve = t.validation_curve
    if not curve:
        return
    val = t.evaluation.validation
    doc.p(f"Early stopping on the validation days ({rows(val.rows if val is not None else None)}): {t.epochs_run} of at most "
          f"{t.epochs} epochs run, epoch {t.chosen_epoch} kept (lowest validation loss)"
          + (", stopped early." if t.stopped_early else "."))
    if len(curve) < 2:  # one point is a number, not a curve
        c = curve[0]
        nan = float("nan")
        loss = c.loss if c.loss is not None else nan
        base = c.baseline_loss if c.baseline_loss is not None else nan
        doc.p(f"One epoch: validation logloss {loss:.4f} (baseline {base:.4f}), "
              f"{auc(c.auc, val.rows if val is not None else None)} (baseline {auc(c.baseline_auc)}).", "muted")
        return
    doc.img(plots.validation_curve([c.model_dump() for c in curve], t.chosen_epoch), "validation curve")


def training_section(doc: ReportDoc, run_dir: Path, m: dict[str, Any]) -> None:
    """The loss per logged step from metrics.jsonl, and the run's last step from metrics.json when
    the trainer did not log it (a run shorter than `log_every_steps` logs no line at all)."""
    points = [p for p in load_jsonl(run_dir / "metrics.jsonl") if isinstance(p.get("step"), (int, float))]
    last = m.get("step")
    final: dict[str, Any] | None = None
    doc.h2("Training curve", "training")
    if finite(last) and (not points or max(p["step"] for p in points) < last):
        final = {"step": last, **{k: m[k] for k in ("logloss", "auc") if finite(m.get(k))}}
        logged = f"metrics.jsonl ends at step {int(max(p['step'] for p in points))}" if points else "metrics.jsonl has no line"
        doc.p(f"{logged}; the run ended at step {last:.0f} (the trainer logs every log_every_steps steps): its end-of-run "
              "scores from metrics.json are drawn there.", "muted")
    png = plots.training_curve(points, final)
    if png:
        doc.img(png, "training curve")
    else:
        doc.p("No training metrics: metrics.jsonl has no line and metrics.json no step.", "muted")
    doc.end()
