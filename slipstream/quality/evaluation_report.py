"""The insight report's model sections, from the run's typed metrics.json: every evaluation set
with its rows, users and intervals, the prequential curve with its intervals, and the
forward-tail decision. Each function adds one section to the report's document (`doc`: `h2`,
`p`, `table`, `img`, `end`), so the report composes them where it wants them.

"Best achievable" (the generator's hidden probability on the same rows) is shown only where its
interval is narrower than the gap it explains (`EvalSet.best_is_informative`); an interleaved
hold-out is never called the future.
"""

from __future__ import annotations

import io
from typing import Any, Protocol

from slipstream.pipeline.run_metrics import SET_TITLES, AucScore, EvalSet, ProgressScores, RunMetrics, WindowScores
from slipstream.quality.report_doc import Finding

SET_ORDER = ("forward_tail", "prequential", "holdout_after_t", "validation", "holdout_before_t")


class Doc(Protocol):
    def h2(self, title: str, anchor: str) -> None: ...

    def end(self) -> None: ...

    def p(self, text: str, cls: str = "") -> None: ...

    def table(self, rows: list[tuple[Any, ...]], header: tuple[str, ...] | None = None) -> None: ...

    def img(self, png: bytes | None, alt: str) -> None: ...

    def finding(self, f: Finding) -> None: ...


def _score(s: AucScore | None) -> str:
    return s.text() if s is not None else "–"


def _best(s: EvalSet) -> str:
    if s.best is None:
        return "–"
    if not s.best_is_informative():
        return f"not shown (interval {s.best.text()} wider than the gap it explains)"
    return s.best.text()


def evaluation_table(doc: Doc, m: RunMetrics) -> None:
    """One row per evaluation set: the model and every comparison scored on the same rows."""
    ev = m.evaluation
    rows = []
    for name in SET_ORDER:
        s = ev.get(name)
        if s is None or not s.rows:
            continue
        rows.append((SET_TITLES[name], f"{s.rows:,} rows, {s.users:,} users", _score(s.model), _score(s.baseline),
                     s.vs_baseline.text() if s.vs_baseline else "–", _score(s.popularity), _score(s.batch_only),
                     _score(s.champion), _best(s)))
    if not rows:
        doc.p("No evaluation set was scored (metrics.json of an older Slipstream, or a run without data).", "muted")
        return
    doc.table(rows, ("set", "rows", "model AUC [95% CI]", "logistic baseline", "model − baseline", "item popularity",
                     "batch-only", f"champion {ev.champion_run_id or ''}".strip(), "best achievable"))
    doc.p("Intervals: 95%, from a bootstrap over users (rows of one user are not independent). Differences are "
          "paired: both models on the same rows and resamples.", "muted")
    if ev.champion_note:
        doc.p(f"The champion was not re-scored: {ev.champion_note}.", "muted")


def prequential_section(doc: Doc, m: RunMetrics) -> None:
    """The stream scored before training: the curve per window of event time, with intervals."""
    pre, ev = m.evaluation.prequential, m.evaluation
    doc.h2("Prequential evaluation of the stream", "prequential")
    if pre is None or not pre.rows:
        doc.p("No stream row was scored before training (no stream phase, or a run from before prequential "
              "evaluation).", "muted")
        doc.end()
        return
    kept = (f" (the newest {ev.prequential_kept:,} of {ev.prequential_seen:,} scored)"
            if ev.prequential_seen > ev.prequential_kept else "")
    doc.p(f"Every stream row was scored by the model as it was just before the step that trained on it: {pre.rows:,} "
          f"rows of {pre.users:,} users{kept}. AUC {_score(pre.model)}; logistic baseline updated online on the same "
          f"rows {_score(pre.baseline)}; batch-only model {_score(pre.batch_only)}; stream lift (model − batch-only) "
          f"{pre.vs_batch_only.text() if pre.vs_batch_only else 'n/a'}.")
    doc.img(prequential_plot(ev.prequential_windows, ev.prequential_progress),
            "prequential AUC per window with 95% intervals")
    doc.table([(w.start.isoformat(timespec="minutes"), f"{w.scores.rows:,}", _score(w.scores.model), _score(w.scores.baseline),
                _score(w.scores.batch_only), w.scores.vs_batch_only.text() if w.scores.vs_batch_only else "–")
               for w in ev.prequential_windows],
              ("window from", "rows", "model", "logistic baseline", "batch-only", "stream lift"))
    if ev.prequential_progress:
        doc.p("As the model trained: the same rows in the order the model scored them, in blocks of training steps "
              "(a replay trains its buffered rows in random order of event time, so the windows above average the "
              "whole stream phase; these blocks show what the steps did).", "muted")
        doc.table([(f"{p.first_step}–{p.last_step}", f"{p.scores.rows:,}", _score(p.scores.model), _score(p.scores.baseline),
                    p.scores.vs_batch_only.text() if p.scores.vs_batch_only else "–") for p in ev.prequential_progress],
                  ("steps", "rows", "model", "logistic baseline", "stream lift"))
    doc.end()


def decision_section(doc: Doc, m: RunMetrics, decision: dict[str, Any] | None, promotion: Finding | None = None) -> None:
    """The forward tail and what the registry decided on it; `promotion`: the summary's finding on
    the decision, repeated here when it is red (with what to do)."""
    tail = m.evaluation.forward_tail
    doc.h2("Forward tail and promotion", "decision")
    if tail is not None and tail.rows:
        start = m.forward_tail_start.isoformat() if m.forward_tail_start else "?"
        doc.p(f"Forward tail: the stream's rows from {start} on (the last part after T by event time), never trained: "
              f"{tail.rows:,} rows of {tail.users:,} users. Model {_score(tail.model)}, logistic baseline "
              f"{_score(tail.baseline)}, model − baseline {tail.vs_baseline.text() if tail.vs_baseline else 'n/a'}"
              + (f", model − champion {tail.vs_champion.text()}" if tail.vs_champion else "") + ".")
    else:
        doc.p("No forward tail: the decision falls back to the validation days (a champion is never replaced on them).",
              "muted")
    if decision:
        verdict = "PROMOTED" if decision.get("promoted") else "registered, not promoted"
        doc.p(f"Decision ({decision.get('rule', 'significant')} rule): {verdict} — {decision.get('reason', '')}",
              "ok" if decision.get("promoted") else "bad")
    if promotion is not None and promotion.ok is False:
        doc.finding(promotion)
    doc.end()


def prequential_plot(windows: list[WindowScores], progress: list[ProgressScores]) -> bytes | None:
    """AUC per window of event time (left) and per block of training steps (right): model, logistic
    baseline and batch-only, each with its interval."""
    if not windows and not progress:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.2))
    _curves(left, [w.start for w in windows], [w.scores for w in windows])
    left.set_title("per window of event time")
    left.set_ylabel("AUC (95% CI)")
    _curves(right, [p.last_step for p in progress], [p.scores for p in progress])
    right.set_title("as the model trained (rows in scoring order)")
    right.set_xlabel("training step")
    fig.autofmt_xdate()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _curves(ax: Any, x: list[Any], sets: list[EvalSet]) -> None:
    for attr, label, style in (("model", "model (prequential)", "-o"), ("baseline", "logistic baseline", "--s"),
                               ("batch_only", "batch-only model", ":^")):
        pts = [(t, getattr(s, attr)) for t, s in zip(x, sets, strict=True)]
        pts = [(t, sc) for t, sc in pts if sc is not None and sc.auc is not None]
        if not pts:
            continue
        line = ax.plot([t for t, _ in pts], [sc.auc for _, sc in pts], style, ms=3, label=label)[0]
        band = [(t, sc.lo, sc.hi) for t, sc in pts if sc.has_interval]
        if band:
            ax.fill_between([b[0] for b in band], [b[1] for b in band], [b[2] for b in band], color=line.get_color(),
                            alpha=0.15, lw=0)
    ax.axhline(0.5, color="#999", lw=0.8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
