"""Whether a challenger replaces the champion: the rule, on the numbers of its metrics.json.

The forward tail decides (`slipstream.pipeline.run_metrics`, set `forward_tail`): rows later than
anything the challenger trained on, scored by the challenger, its logistic baseline and the
champion in the same step. Rule `significant` (the default): promoted when the lower 95% bound
of challenger − baseline is above 0 *and*, with a champion, the lower bound of challenger −
champion is above −tolerance. Rule `point`: the point estimates (challenger > baseline, challenger
≥ champion − tolerance). Without a forward tail the validation days decide against the baseline
only, and a champion is never replaced on them. Every reason names the numbers, the rows, the
users and the intervals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from slipstream.pipeline.run_metrics import Difference, EvalSet, RunMetrics

PromotionRule = Literal["significant", "point"]
RULES: tuple[str, ...] = ("significant", "point")


@dataclass(frozen=True)
class PromotionDecision:
    promoted: bool
    challenger_run_id: str
    challenger_auc: float | None
    champion_run_id: str | None
    champion_auc: float | None
    tolerance: float
    reason: str
    baseline_auc: float | None = None
    evaluated_on: str = ""
    """`forward_tail` (the future) or `validation` (no stream phase: the last days before T)."""
    rows: int = 0
    """Rows of the set the decision was made on."""
    users: int = 0
    vs_baseline: dict[str, float | None] | None = None
    """challenger − baseline: {diff, lo, hi} (95% interval over users)."""
    vs_champion: dict[str, float | None] | None = None
    """challenger − champion on the same rows: {diff, lo, hi}."""
    rule: str = "significant"
    registered: bool = True
    """Every published run is registered (its package); `promoted`: it is the champion now."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide_promotion(challenger_run_id: str, metrics: RunMetrics, champion: Mapping[str, Any] | None,
                     tolerance: float, rule: str = "significant") -> PromotionDecision:
    """Promote a challenger shown better than its own baseline on the forward tail and not shown
    worse than the champion re-scored on the same rows (see the module docstring)."""
    return _Decider(challenger_run_id, metrics, champion, tolerance, rule).decide()


def _diff_dict(d: Difference | None) -> dict[str, float | None] | None:
    return None if d is None else {"diff": d.diff, "lo": d.lo, "hi": d.hi}


class _Decider:
    def __init__(self, run_id: str, m: RunMetrics, champion: Mapping[str, Any] | None, tolerance: float, rule: str) -> None:
        self.run_id, self.m, self.tolerance, self.rule = run_id, m, tolerance, rule
        self.champ_id: str | None = str(champion["run_id"]) if champion and champion.get("run_id") else None
        ev = m.evaluation
        tail, val = ev.forward_tail, ev.validation
        self.where = "forward_tail" if tail is not None and tail.scored else "validation"
        self.set: EvalSet = (tail if self.where == "forward_tail" else val) or EvalSet()
        self.same_id = ev.champion_run_id

    # --- the numbers, in words -------------------------------------------------------------
    @property
    def chall(self) -> float | None:
        return self.set.model.auc if self.set.model is not None else None

    @property
    def base(self) -> float | None:
        return self.set.baseline.auc if self.set.baseline is not None else None

    def on(self) -> str:
        what = "forward-tail rows after T" if self.where == "forward_tail" else "validation rows"
        return f"on {self.set.rows:,} {what} of {self.set.users:,} users"

    def vs_base(self) -> str:
        d = self.set.vs_baseline
        return f"{self.chall:.4f} vs its logistic baseline {self.base:.4f}: {d.text() if d else 'n/a'}"

    def verdict(self, promoted: bool, reason: str) -> PromotionDecision:
        champ_auc = (self.set.champion.auc if self.set.champion is not None and self.same_id == self.champ_id
                     and self.where == "forward_tail" else None)
        return PromotionDecision(promoted, self.run_id, self.chall, self.champ_id, champ_auc, self.tolerance, reason,
                                 self.base, self.where, self.set.rows, self.set.users, _diff_dict(self.set.vs_baseline),
                                 _diff_dict(self.set.vs_champion), self.rule)

    # --- the rule --------------------------------------------------------------------------
    def beats_baseline(self) -> tuple[bool, str]:
        d = self.set.vs_baseline
        if self.base is None or d is None or d.diff is None:
            return self.rule == "point", f"AUC {self.chall:.4f} {self.on()} (no baseline scored)"
        if self.rule == "point":
            ok = d.diff > 0
            return ok, f"AUC {self.vs_base()} {self.on()}" + ("" if ok else ": it does not beat its logistic-regression baseline")
        if d.lo is None:
            return False, (f"AUC {self.vs_base()} {self.on()}: too few rows for an interval, so its advantage over its "
                           "logistic-regression baseline is not shown")
        if d.lo > 0:
            return True, f"AUC {self.vs_base()} {self.on()}, lower bound above 0"
        if d.diff <= 0:
            return False, f"AUC {self.vs_base()} {self.on()}: it does not beat its logistic-regression baseline"
        return False, (f"AUC {self.vs_base()} {self.on()}: its advantage over its logistic-regression baseline is not "
                       "significant (the 95% lower bound must be above 0)")

    def decide(self) -> PromotionDecision:
        if self.chall is None:
            return self.verdict(False, f"the challenger has no finite AUC {self.on()} in metrics.json")
        ok, beats = self.beats_baseline()
        if not ok:
            return self.verdict(False, f"registered, not promoted: {beats}")
        if self.champ_id is None:
            return self.verdict(True, f"no champion yet: the first model is promoted; {beats}")
        if self.champ_id == self.run_id:
            return self.verdict(True, "the challenger is already the champion (re-published)")
        if self.where != "forward_tail":
            return self.verdict(False, f"registered, not promoted: {beats}, but without a forward tail after T the champion "
                                       f"{self.champ_id} cannot be compared on rows neither trained on: it stays (run the "
                                       "stream phase to judge on the future)")
        champ, d = self.set.champion, self.set.vs_champion
        if self.same_id != self.champ_id or champ is None or champ.auc is None or d is None or d.diff is None:
            why = self.m.evaluation.champion_note or "it was not re-scored on this run's rows"
            return self.verdict(False, f"registered, not promoted: {beats}, but the champion {self.champ_id} could not be "
                                       f"compared ({why}): it stays")
        vs = (f"vs the champion {self.champ_id} on the same {self.set.rows:,} rows: {self.chall:.4f} vs {champ.auc:.4f} "
              f"({d.text()})")
        if self.rule == "point":
            ok, bound = d.diff >= -self.tolerance, f"the difference {d.diff:+.4f}"
        elif d.lo is None:
            ok, bound = False, "no interval (too few rows)"
        else:
            ok, bound = d.lo > -self.tolerance, f"the lower bound {d.lo:+.4f}"
        if ok:
            return self.verdict(True, f"{beats}; {vs}: {bound} is within the tolerance {self.tolerance}")
        return self.verdict(False, f"registered, not promoted: {beats}; {vs}: {bound} is below -{self.tolerance}: "
                                   "the champion stays")
