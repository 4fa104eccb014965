"""The words and number formats every page of a run uses: the gate, the report's summary and its
sections, the promotion line. One place, so the same fact reads the same everywhere.

Every number carries its unit, the rows it was measured on and, where one was computed, its 95 %
interval; a comparison is called better or worse only when its interval says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from slipstream.quality.drift import FeatureShift


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def rows(n: Any) -> str:
    """`1,999 rows` (or `unknown rows`)."""
    return f"{int(n):,} rows" if finite(n) else "unknown rows"


def share(x: Any, digits: int = 1) -> str:
    """A fraction as a percentage: `8.0 %`."""
    return f"{100 * x:.{digits}f} %" if finite(x) else "–"


def ci(interval: Sequence[Any] | None, signed: bool = False) -> str:
    """`95 % CI [0.6812, 0.7204]`, or '' without a finite interval."""
    if not interval or len(interval) < 2 or not (finite(interval[0]) and finite(interval[1])):
        return ""
    f = "{:+.4f}" if signed else "{:.4f}"
    return f"95 % CI [{f.format(interval[0])}, {f.format(interval[1])}]"


def auc(value: Any, n: Any = None, interval: Sequence[Any] | None = None) -> str:
    """`AUC 0.7012 on 2,310 rows, 95 % CI [0.6812, 0.7204]`; `–` without a finite AUC."""
    if not finite(value):
        return "–"
    parts = [f"AUC {value:.4f}"]
    if finite(n):
        parts.append(f"on {rows(n)}")
    text = " ".join(parts)
    bounds = ci(interval)
    return f"{text}, {bounds}" if bounds else text


def seconds(x: Any) -> str:
    return f"{x:,.1f} s" if finite(x) else "–"


def rate(x: Any, unit: str = "samples/s") -> str:
    return f"{x:,.0f} {unit}" if finite(x) else "–"


def difference(diff: Any, interval: Sequence[Any] | None, n: Any, than: str) -> tuple[str, str]:
    """A model's AUC minus another's on the same rows, in words, and its verdict: `better`,
    `worse` or `unclear` (the interval includes 0, or there is none)."""
    if not finite(diff):
        return f"not compared with {than} (no score)", "unclear"
    on = f" on the same {rows(n)}" if finite(n) else ""
    bounds = ci(interval, signed=True)
    amount = f"{diff:+.4f} AUC" + (f", {bounds}" if bounds else "") + on
    if bounds and interval is not None and interval[0] > 0:
        return f"better than {than}: {amount}", "better"
    if bounds and interval is not None and interval[1] < 0:
        return f"worse than {than}: {amount}", "worse"
    why = "the interval includes 0" if bounds else "no interval was computed"
    return f"not shown better than {than}: {amount} ({why})", "unclear"


def shift_detail(s: FeatureShift, ref: str = "trailing") -> str:
    """How far a feature moved and what was allowed, e.g. `JS 0.214 at 1,999 rows vs 14,308
    trailing rows; chance at these sizes and its usual movement (28 days) allow 0.061`."""
    basis = (f"chance at these sizes and its usual movement ({s.baseline_days} days) allow" if s.baseline_days
             else "chance at these sizes and the fixed threshold (too little history to know its usual movement) allow")
    if s.expected != s.expected:
        basis = "the fixed threshold is"
    return (f"{s.method.upper()} {s.score:.3f} at {rows(s.rows_b)} vs {s.rows_a:,} {ref} rows; "
            f"{basis} {s.threshold:.3f}")


ACTIONS: dict[str, str] = {
    "schema": "Align the preprocessing job with the data set's spec (or the spec with the data), then re-run "
              "preprocessing for the day.",
    "rows.nonempty": "Check that the day was preprocessed and committed before the pinned snapshot; re-run preprocessing for it.",
    "days.nonempty": "Re-deliver the missing days' raw files and re-run preprocessing for them, or train without them knowingly.",
    "not_null.": "Find where the field goes missing upstream, or give it a default in the spec.",
    "finite.": "Find the NaN/inf values upstream (a division, a parse) and fix or clip them in the spec.",
    "range.": "Check the feature's clip/scale in the spec against the data; values outside mean a unit or parsing change.",
    "distinct.": "A constant or exploding feature: check the field upstream, or set quality.max_distinct in the spec.",
    "sequence.": "Check the sequence join (its key and time field) in the preprocessing job.",
    "label.binary": "Fix the label rule in the spec so that it yields 0 or 1.",
    "unique.sample_id": "Remove the duplicate events upstream, or make the spec's id cover what tells them apart.",
    "event_time.in_interval": "Check the time field's format and time zone in the spec; re-run preprocessing for the day.",
    "row_count.vs_expected": "Look for lost raw files or a stalled upstream job for the day; if the volume is real, "
                                  "set gate_rows_ratio_min/max for this run.",
    "ctr": "Check the label source (late or duplicated label events, a changed label rule); if real, set "
           "gate_ctr_min/max for this run.",
    "drift.": "Check what changed upstream since that day (a new client, a logging or feature change); if it is real, "
              "the model adapts by retraining on it.",
}


def action_for(check: str) -> str:
    """One line on what to do about a failed check, by its name (the longest matching prefix)."""
    keys = [k for k in ACTIONS if check == k or (k.endswith(".") and check.startswith(k))]
    return ACTIONS[max(keys, key=len)] if keys else "Open the gate's page for the details of this check."


SKEW_ACTION = ("Compare how the batch job and the stream (joiner) compute this feature: a different default, join or "
               "unit shows as skew; if both are right, the stream's hours differ for real.")
DRIFT_ACTION = ACTIONS["drift."]
AUDIT_ACTION = ("Re-run the training from its last checkpoint; if ids stay lost or duplicated, check the Kafka offsets in "
                "metrics.json against the topic.")
SHUFFLE_ACTION = "Raise the shuffle buffer (data.shuffle_buffer) so that batches mix days and files."
EMPTY_DAYS_ACTION = ACTIONS["days.nonempty"]
