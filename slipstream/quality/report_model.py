"""The report's run and model sections: the summary's facts, the model against its baselines and
the champion, the promotion, freshness, and the training curve (always drawn when the run
logged anything)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slipstream.quality import plots
from slipstream.quality.report_doc import Finding, ReportDoc
from slipstream.quality.wording import auc, difference, finite, rate, rows, share

ROWS_OF = {"after_t": "eval_rows_after_t", "validation": "val_rows", "holdout_before_t": "eval_rows_before_t"}
ON_WORDS = {"after_t": "held-out rows after T", "validation": "the validation days", "holdout_before_t": "held-out rows before T"}


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _auc_of(m: dict[str, Any], key: str, rows_key: str) -> str:
    return auc(m.get(key), m.get(rows_key), m.get(f"{key}_ci"))


def model_finding(m: dict[str, Any]) -> Finding | None:
    """The model against its logistic baseline on the rows the headline AUC comes from."""
    if not finite(m.get("auc")):
        return None
    on = m.get("auc_on", "after_t")
    diff, interval = m.get("auc_diff_vs_baseline"), m.get("auc_diff_vs_baseline_ci")
    if not finite(diff) and finite(m.get("baseline_auc")):
        diff, interval = m["auc"] - m["baseline_auc"], None
    words, verdict = difference(diff, interval, m.get(ROWS_OF.get(on, "")), "its logistic baseline")
    text = f"Model: {_auc_of(m, 'auc', ROWS_OF.get(on, ''))} ({ON_WORDS.get(on, on)}), {words}."
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


def summary_facts(m: dict[str, Any]) -> list[tuple[str, str]]:
    """The run's headline numbers, each with its unit and rows."""
    out: list[tuple[str, str]] = []
    if "window_start" in m and "t_handoff" in m:
        out.append(("training window", f"{m['window_start']} to T = {m['t_handoff']}"
                    + (f" (snapshot {m['snapshot_id']})" if "snapshot_id" in m else "")))
    if "samples_iceberg" in m or "samples_kafka" in m:
        out.append(("rows trained", f"{rows(m.get('samples_iceberg', 0))} from Iceberg, {rows(m.get('samples_kafka', 0))} "
                                    "from Kafka (per epoch and phase, every rank)"))
    if finite(m.get("logloss")):
        on = m.get("auc_on", "after_t")
        out.append(("logloss", f"{m['logloss']:.4f} on {rows(m.get(ROWS_OF.get(on, '')))} ({ON_WORDS.get(on, on)})"))
    best = m.get("best_auc")
    if isinstance(best, dict) and best:
        parts = [f"{auc(best[k])} {w}" for k, w in (("holdout_before_t", "before T"), ("holdout_after_t", "after T"))
                 if finite(best.get(k))]
        if parts:
            out.append(("best achievable", "; ".join(parts) + " (the generator's hidden model on the held-out rows)"))
    if m.get("chosen_epoch") is not None:
        out.append(("epoch kept", f"epoch {m['chosen_epoch']} of {m.get('epochs_run', '?')} run "
                                  f"(at most {m.get('epochs', '?')})"))
    if finite(m.get("samples_per_s")):
        out.append(("throughput", f"{rate(m['samples_per_s'])}; {share(m.get('data_wait_share'))} of the training time "
                                  "waiting for data"))
    if m.get("checkpoint"):
        out.append(("checkpoint", str(m["checkpoint"])))
    return out


def freshness_section(doc: ReportDoc, m: dict[str, Any]) -> None:
    doc.h2("Freshness", "freshness")
    if m:
        lag = m.get("kafka_lag_at_stop")
        doc.table([
            ("newest event time trained on", m.get("newest_event_time") or "unknown"),
            ("Kafka lag at stop", f"{lag:,.0f} records" if finite(lag) else "unknown"),
            ("handoff time T", m.get("t_handoff", "unknown")),
        ])
    else:
        doc.p("unknown (no metrics.json)", "muted")
    doc.end()


def model_section(doc: ReportDoc, m: dict[str, Any], model: Finding | None, promotion: Finding | None) -> None:
    """The model against its baselines and the champion, the validation curve, the promotion."""
    if not m or "auc" not in m and "auc_after_t" not in m:
        return
    doc.h2("Model, baselines and promotion", "model")
    if model is not None:
        doc.finding(model)
    r = ("eval_rows_after_t", "val_rows", "eval_rows_before_t")
    doc.table([
        (f"after T ({rows(m.get(r[0]))} held out, of the stream period)", _auc_of(m, "auc_after_t", r[0]),
         _auc_of(m, "baseline_auc_after_t", r[0]), _auc_of(m, "popularity_auc_after_t", r[0]),
         _auc_of(m, "champion_auc_after_t", r[0]), _auc_of(m, "auc_after_t_batch_only", r[0]), auc(m.get("best_auc_after_t"))),
        (f"validation days ({rows(m.get(r[1]))} before T)", _auc_of(m, "val_auc", r[1]), _auc_of(m, "baseline_val_auc", r[1]),
         "–", "–", "–", "–"),
        (f"held out before T ({rows(m.get(r[2]))}, interleaved with the trained rows)", _auc_of(m, "auc_before_t", r[2]),
         _auc_of(m, "baseline_auc_before_t", r[2]), "–", "–", _auc_of(m, "auc_before_t_batch_only", r[2]),
         auc(m.get("best_auc_before_t"))),
    ], ("scored on", "model", "logistic baseline", "item popularity", f"champion {m.get('champion_run_id') or ''}",
        "batch-only", "best achievable"))
    n = m.get("eval_rows_after_t")
    doc.p("Model − champion: " + difference(m.get("auc_diff_vs_champion"), m.get("auc_diff_vs_champion_ci"), n,
                                            "the champion")[0]
          + " (95 % intervals from a bootstrap over users)."
          + (f" The champion was not re-scored: {m['champion_note']}." if m.get("champion_note") else ""))
    _validation(doc, m)
    if promotion is not None:
        doc.finding(promotion)
    doc.end()


def _validation(doc: ReportDoc, m: dict[str, Any]) -> None:
    curve = m.get("validation_curve") or []
    if not curve:
        return
    doc.p(f"Early stopping on the validation days ({rows(m.get('val_rows'))}): {m.get('epochs_run')} of at most "
          f"{m.get('epochs')} epochs run, epoch {m.get('chosen_epoch')} kept (lowest validation loss)"
          + (", stopped early." if m.get("stopped_early") else "."))
    if len(curve) < 2:  # one point is a number, not a curve
        c = curve[0]
        nan = float("nan")
        doc.p(f"One epoch: validation logloss {c.get('loss', nan):.4f} (baseline {c.get('baseline_loss', nan):.4f}), "
              f"{auc(c.get('auc'), m.get('val_rows'))} (baseline {auc(c.get('baseline_auc'))}).", "muted")
        return
    doc.img(plots.validation_curve(curve, m.get("chosen_epoch")), "validation curve")


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
