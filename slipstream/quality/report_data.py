"""The report's data sections: the run's Iceberg window (distributions, CTR over time), drift over
its days and batch-vs-stream skew on comparable rows, each with its finding."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from slipstream.lake.iceberg import get_catalog
from slipstream.pipeline.runplan import RunPlan
from slipstream.quality import plots
from slipstream.quality.drift import drift_features
from slipstream.quality.drift_days import DriftLine, drift_over_days, summarise
from slipstream.quality.movement import MovementConfig
from slipstream.quality.profiles import US_PER_HOUR, FeatureProfile, merge_profiles, profile_table
from slipstream.quality.reading import day_bounds, load_samples, read_interval
from slipstream.quality.report_doc import Finding, ReportDoc
from slipstream.quality.skew import SkewResult, batch_vs_stream, same_day_features, stream_hours
from slipstream.quality.store import read_profiles
from slipstream.quality.wording import DRIFT_ACTION, EMPTY_DAYS_ACTION, SKEW_ACTION, rows, share
from slipstream.samples.spec import Spec, load_spec
from slipstream.settings import Settings

SKEW_DAYS = 7
"""The last days of the window whose rows at the stream's hours make the batch side of the skew."""


def window_days(start: datetime, end: datetime) -> list[date]:
    out, d = [], start.date()
    while day_bounds(d)[0] < end:
        out.append(d)
        d += timedelta(days=1)
    return out


class Window:
    """The run's Iceberg window: ids/times for the audit, per-day profiles for the plots and drift."""

    def __init__(self, settings: Settings, metrics: dict[str, Any], plan: RunPlan | None) -> None:
        # the run's plan.json when it has one (its window, files and spec); else what metrics.json says
        self.spec: Spec = plan.spec if plan else load_spec(settings.spec)
        self.snapshot_id = plan.snapshot_id if plan else int(metrics["snapshot_id"])
        self.start = plan.window_start if plan else datetime.fromisoformat(metrics["window_start"]).astimezone(UTC)
        self.end = plan.t_handoff if plan else datetime.fromisoformat(metrics["t_handoff"]).astimezone(UTC)
        self.files = plan.files if plan else None
        catalog = get_catalog(settings)
        self.table = load_samples(catalog, settings.namespace)
        keys = self._read(self.start, self.end, ("sample_id", "event_time"), files=self.files)
        self.ids, self.times = keys.column("sample_id").combine_chunks(), keys.column("event_time").combine_chunks()
        days = window_days(self.start, self.end)
        self.history_days = self.spec.quality.history_days
        self.movement = MovementConfig()
        # the days before the window whose movement is the usual one, and their own trailing days
        before = days[0] - timedelta(days=self.history_days + self.movement.baseline_days)
        stored = read_profiles(catalog, settings.namespace, before, days[-1] + timedelta(days=1))
        self.profiled_here: list[date] = []
        for d in days:
            if d not in stored:
                lo, hi = day_bounds(d)
                stored[d] = profile_table(self._read(max(lo, self.start), min(hi, self.end), self.spec.sample_columns), self.spec)
                self.profiled_here.append(d)
        self.day_profiles = dict(sorted(stored.items()))
        self.days = days
        # days without rows: preprocessing skips a day without raw events
        self.empty_days = [d for d in days if not self.day_profiles[d].rows]
        self.profiled_here = [d for d in self.profiled_here if d not in self.empty_days]
        self.profile = merge_profiles(self.day_profiles[d] for d in days)

    def _read(self, start: datetime, end: datetime, columns: tuple[str, ...], files: Any = None) -> pa.Table:
        """The window's rows in [start, end) (a day's files may hold rows of other days): of the
        plan's `files` for the whole window, else of the files Iceberg plans for the interval."""
        t = read_interval(self.table, self.snapshot_id, start, end, columns, files=files)
        ts = t.column("event_time")
        return t.filter(pc.and_(pc.greater_equal(ts, pa.scalar(start, ts.type)), pc.less(ts, pa.scalar(end, ts.type))))

    def drift(self) -> dict[date, list[Any]]:
        return drift_over_days(self.day_profiles, self.days, self.spec, self.history_days, self.movement)

    def hour_slices(self) -> dict[tuple[date, int], FeatureProfile]:
        """The last SKEW_DAYS days with rows, one profile per (day, UTC hour)."""
        out = {}
        columns = ("event_time", *drift_features(self.spec))  # what skew compares: no ids to sketch
        for d in [d for d in self.days if d not in self.empty_days][-SKEW_DAYS:]:
            lo, hi = day_bounds(d)
            t = self._read(max(lo, self.start), min(hi, self.end), columns)
            hours = pc.cast(t.column("event_time"), pa.int64()).to_numpy() // US_PER_HOUR % 24
            for h in np.unique(hours):
                out[(d, int(h))] = profile_table(t.filter(pa.array(hours == h)), self.spec)
        return out


def drift_finding(lines: list[DriftLine], window: Window | None) -> Finding:
    drifted = [ln for ln in lines if ln.drifted]
    if window is None:
        return Finding("Drift", "Drift not judged: the Iceberg window is unknown.", None, anchor="drift")
    days = len(window.days)
    if not lines:
        return Finding("Drift", "Drift not judged: fewer than two days with data.", None, anchor="drift")
    if not drifted:
        return Finding("Drift", f"Drift: all {len(lines)} features stayed within their usual day-to-day movement "
                                f"over the window's {days} days.", True, anchor="drift")
    names = "; ".join(f"{ln.feature} ({len(ln.alarmed)} of {ln.days_tested} days, since {ln.alarmed[0]})" for ln in drifted)
    return Finding("Drift", f"Drift: {len(drifted)} of {len(lines)} features moved more than usual: {names}.", False,
                   DRIFT_ACTION, "drift")


def skew_finding(res: SkewResult | None, why_not: str = "") -> Finding:
    if res is None or not res.shifts:
        return Finding("Skew", f"Skew not judged: {why_not or 'no comparable rows'}.", None, anchor="skew")
    where = f"batch rows at the stream's hours ({res.hours_text()}) of {len(res.days)} days"
    if not res.skewed:
        return Finding("Skew", f"Skew: none of {len(res.shifts)} features differs between the stream and the {where} "
                               "more than one batch day differs from the others.", True, anchor="skew")
    names = ", ".join(f"{s.feature} ({s.method.upper()} {s.score:.3f} > {s.threshold:.3f})" for s in res.skewed)
    return Finding("Skew", f"Skew: {names} between the stream and the {where}.", False, SKEW_ACTION, "skew")


def empty_days_finding(window: Window) -> Finding | None:
    if not window.empty_days:
        return None
    return Finding("Days without data", "Days without data: " + ", ".join(map(str, window.empty_days))
                   + " (no raw events: skipped by preprocessing, the window trained without them).", False,
                   EMPTY_DAYS_ACTION, "distributions")


def distributions_section(doc: ReportDoc, window: Window | None, stream: FeatureProfile | None, empty: Finding | None) -> None:
    doc.h2("Distributions", "distributions")
    if window is None:
        doc.p("Iceberg window unknown: no distributions.", "muted")
    else:
        doc.p(f"{rows(window.profile.rows)} in the window over {len(window.days)} days of the {window.spec.name} "
              f"spec's {len(window.spec.features)} features"
              + (f" (profiled now: {', '.join(map(str, window.profiled_here))})" if window.profiled_here else ""), "muted")
        if empty is not None:
            doc.finding(empty)
        doc.img(plots.distributions(window.profile, stream, window.spec), "feature distributions")
    doc.end()


def drift_section(doc: ReportDoc, window: Window | None, series: dict[date, list[Any]], lines: list[DriftLine],
                  finding: Finding) -> None:
    doc.h2("Drift over days", "drift")
    doc.finding(finding)
    if window is not None and series:
        m = window.movement
        doc.p(f"Each day with data against its trailing {window.history_days} days. A feature moved more than usual "
              f"when its distance (PSI for numbers, Jensen–Shannon for categories and lengths) is past what chance "
              f"gives at that day's size ({m.quantile:.1%} of {m.bootstrap} redraws) and past {m.usual_factor:g}x the "
              f"largest such move of its last {m.baseline_days} days; until {m.min_baseline} past days are known, past "
              f"PSI {m.fallback_psi:g} / JS {m.fallback_js:g}. Small days get wide limits, not alarms.", "muted")
        doc.img(plots.drift_over_days(series), "drift over days")
        doc.table([(ln.feature, ln.text()) for ln in lines], ("feature", "over the window"),
                  ["bad" if ln.drifted else "" for ln in lines])
    doc.end()


def ctr_section(doc: ReportDoc, window: Window | None, stream: FeatureProfile | None, metrics: dict[str, Any]) -> None:
    doc.h2("CTR over time", "ctr")
    if window is not None:
        p = window.profile
        doc.p(f"Label rate of the window: {share(p.ctr, 2)} of {rows(p.rows)}"
              + (f"; of the stream: {share(stream.ctr, 2)} of {rows(stream.rows)}" if stream is not None and stream.rows else "")
              + ".", "muted")
        t = datetime.fromisoformat(metrics["t_handoff"]) if "t_handoff" in metrics else None
        doc.img(plots.ctr_over_time(p, stream, t), "CTR over time")
    else:
        doc.p("no data", "muted")
    doc.end()


def skew_result(window: Window | None, stream: FeatureProfile | None) -> tuple[SkewResult | None, str]:
    """The skew of the run's stream against the hour-matched batch, or why there is none."""
    if stream is None:
        return None, "no stream phase: the run has no stream_profile.json"
    if window is None:
        return None, "the Iceberg window is unknown"
    slices = window.hour_slices()
    hours = stream_hours(stream)
    if not any(h in hours for _, h in slices):
        hours = frozenset(h for _, h in slices)  # no batch row at the stream's hours: whole days, labelled
    return batch_vs_stream(slices, stream, window.spec, hours, window.movement), ""


def skew_section(doc: ReportDoc, res: SkewResult | None, finding: Finding, spec: Spec | None) -> None:
    doc.h2("Batch-vs-stream skew", "skew")
    doc.finding(finding)
    if res is not None and res.shifts and spec is not None:
        same_day = same_day_features(spec)
        doc.p(f"Batch side: {rows(res.shifts[0].rows_a)} at {res.hours_text()} on {', '.join(map(str, res.days))}; "
              f"stream: {rows(res.shifts[0].rows_b)}. A feature is flagged when the stream differs from them more than "
              "chance at these sizes allows and more than one batch hour usually differs from the rest."
              + (f" Same-day sequences ({', '.join(sorted(same_day))}) depend on the hour by construction: their usual "
                 "movement is measured between the days' same hours only." if same_day else ""), "muted")
        doc.img(plots.skew_bars(res.shifts), "batch-vs-stream skew")
        doc.table([(s.feature + (" (same-day sequence)" if s.feature in same_day else ""), s.method.upper(), f"{s.score:.4f}",
                    f"{s.threshold:.4f}", _num(s.mean_a), _num(s.mean_b), share(s.null_rate_a, 2), share(s.null_rate_b, 2),
                    "SKEW" if s.drifted else "ok") for s in res.shifts],
                  ("feature", "distance", "score", "limit", "mean (batch)", "mean (stream)", "nulls (batch)",
                   "nulls (stream)", ""), ["bad" if s.drifted else "" for s in res.shifts])
    doc.end()


def _num(x: float) -> str:
    return "–" if x != x else f"{x:.4g}"  # NaN: no mean for a categorical feature


def drift_lines(window: Window | None) -> tuple[dict[date, list[Any]], list[DriftLine]]:
    if window is None:
        return {}, []
    series = window.drift()
    return series, summarise(series, window.spec)
