"""The insight report of a training run: one static HTML file, `<runs_dir>/<run_id>/report.html`.

What went in (distributions, CTR over time, drift across the window's days, batch-vs-stream
skew), how fresh it was, whether every sample was trained exactly once, and how well the batch
phase was shuffled. It works from the run folder (docs/trainer.md, Run layout), the pinned Iceberg
snapshot and the stored `sample_profiles`; every optional piece that is missing becomes a
sentence in its section, never an error.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from slipstream.errors import ConfigError, SlipstreamError
from slipstream.lake.iceberg import get_catalog
from slipstream.pipeline.run_metrics import RunMetrics, parse_run_metrics
from slipstream.quality import evaluation_report, plots
from slipstream.quality.audit import AuditResult, audit_run, read_audit, read_kafka_range
from slipstream.quality.drift import FeatureShift, compare_profiles, drift_features
from slipstream.quality.profiles import FeatureProfile, merge_profiles, profile_table
from slipstream.quality.reading import day_bounds, load_samples, read_interval
from slipstream.quality.store import read_profiles, read_results
from slipstream.pipeline.runlayout import REPORT_FILE
from slipstream.pipeline.runlayout import run_dir as run_folder_of
from slipstream.pipeline.runplan import RunPlan, plan_path, read_plan
from slipstream.samples.spec import Spec, load_spec
from slipstream.settings import Settings
from slipstream.stream.kafka import KafkaAccess
from slipstream.templating import render

log = logging.getLogger(__name__)

class _Doc:
    """The report's content in page order: sections (`h2` ... `end`) of paragraphs, tables and
    plots, rendered at the end by `templates/report.html.j2` (Jinja2, autoescaped)."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._section: dict[str, Any] | None = None

    def _add(self, block: dict[str, Any]) -> None:
        (self._section["blocks"] if self._section is not None else self.blocks).append(block)

    def h2(self, title: str, anchor: str) -> None:
        self._section = {"kind": "section", "title": title, "anchor": anchor, "blocks": []}
        self.blocks.append(self._section)

    def end(self) -> None:
        self._section = None

    def p(self, text: str, cls: str = "") -> None:
        self._add({"kind": "p", "text": text, "cls": cls})

    def table(self, rows: list[tuple[Any, ...]], header: tuple[str, ...] | None = None) -> None:
        self._add({"kind": "table", "header": header or (), "rows": [[str(c) for c in r] for r in rows]})

    def img(self, png: bytes | None, alt: str) -> None:
        if png:
            self._add({"kind": "img", "alt": alt, "png_base64": base64.b64encode(png).decode("ascii")})

    def render(self, run_id: str, footer: str) -> str:
        return render("slipstream.quality", "report.html.j2", run_id=run_id, blocks=self.blocks, footer=footer)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def _load_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _days(start: datetime, end: datetime) -> list[date]:
    out, d = [], start.date()
    while day_bounds(d)[0] < end:
        out.append(d)
        d += timedelta(days=1)
    return out


def _num(x: float) -> str:
    return "—" if x != x else f"{x:.4g}"  # NaN: no mean for a categorical feature


def _offsets(raw: Any) -> dict[int, int]:
    return {int(k): int(v) for k, v in (raw or {}).items()}


class _Window:
    """The run's Iceberg window: ids/times for the audit, per-day profiles for the plots."""

    def __init__(self, settings: Settings, metrics: RunMetrics, plan: RunPlan | None) -> None:
        settings = run_settings(settings, metrics)
        # the run's plan.json when it has one (its window, files and spec); else what metrics.json says
        self.spec: Spec = plan.spec if plan else load_spec(settings.spec)
        if plan is None and (metrics.snapshot_id is None or metrics.window_start is None or metrics.t_handoff is None):
            raise ValueError("neither plan.json nor metrics.json name the run's snapshot and window")
        self.snapshot_id = plan.snapshot_id if plan else int(metrics.snapshot_id)  # type: ignore[arg-type]  # checked above
        self.start = plan.window_start if plan else metrics.window_start.astimezone(timezone.utc)  # type: ignore[union-attr]
        self.end = plan.t_handoff if plan else metrics.t_handoff.astimezone(timezone.utc)  # type: ignore[union-attr]
        catalog = get_catalog(settings)
        table = load_samples(catalog, settings.namespace)
        keys = read_interval(table, self.snapshot_id, self.start, self.end, ("sample_id", "event_time"),
                             files=plan.files if plan else None)
        ts = keys.column("event_time")
        inside = pc.and_(pc.greater_equal(ts, pa.scalar(self.start, ts.type)), pc.less(ts, pa.scalar(self.end, ts.type)))
        keys = keys.filter(inside)
        self.ids, self.times = keys.column("sample_id").combine_chunks(), keys.column("event_time").combine_chunks()
        days = _days(self.start, self.end)
        self.history_days = self.spec.quality.history_days
        stored = read_profiles(catalog, settings.namespace, days[0] - timedelta(days=self.history_days), days[-1] + timedelta(days=1))
        self.profiled_here: list[date] = []
        for d in days:
            if d not in stored:
                lo, hi = day_bounds(d)
                stored[d] = profile_table(read_interval(table, self.snapshot_id, max(lo, self.start), min(hi, self.end),
                                                         self.spec.sample_columns), self.spec)
                self.profiled_here.append(d)
        self.day_profiles = dict(sorted(stored.items()))
        self.days = days
        # days without rows: preprocessing skips a day without raw events
        self.empty_days = [d for d in days if not self.day_profiles[d].rows]
        self.profiled_here = [d for d in self.profiled_here if d not in self.empty_days]
        self.profile = merge_profiles(self.day_profiles[d] for d in days)

    def drift_series(self) -> dict[date, list[FeatureShift]]:
        """Each day with rows against the merged profiles of its trailing days with rows."""
        out = {}
        for d in self.days:
            if not self.day_profiles[d].rows:
                continue
            before = [p for k, p in self.day_profiles.items() if d - timedelta(days=self.history_days) <= k < d and p.rows]
            if before:
                out[d] = compare_profiles(merge_profiles(before), self.day_profiles[d], self.spec)
        return out


def _fmt(x: Any) -> str:
    return f"{x:.4f}" if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def _model_sections(doc: _Doc, run_dir: Path, m: RunMetrics) -> None:
    """The model on every evaluation set, the prequential curve, the forward-tail decision and the
    validation curve (`slipstream.quality.evaluation_report`)."""
    if m.auc_on is None and not m.validation_curve:
        return
    doc.h2("Model, baselines and evaluation sets", "model")
    evaluation_report.evaluation_table(doc, m)
    if m.validation_curve:
        doc.p(f"Early stopping on the validation days: {m.epochs_run} of at most {m.epochs} epochs run, "
              f"epoch {m.chosen_epoch} kept (lowest validation loss)" + (", stopped early." if m.stopped_early else "."))
        img = plots.validation_curve([c.model_dump() for c in m.validation_curve], m.chosen_epoch)
        if img:
            doc.img(img, "validation curve")
    doc.end()
    evaluation_report.prequential_section(doc, m)
    evaluation_report.decision_section(doc, m, (_load_json(run_dir / "summary.json") or {}).get("publish"))


def run_settings(settings: Settings, metrics: RunMetrics) -> Settings:
    """The settings the run itself used, as far as metrics.json records them (a run may set its own
    catalog, namespace, topic or broker: the report must audit those, not the deployment's defaults)."""
    given = {"catalog": metrics.catalog, "namespace": metrics.namespace, "topic": metrics.topic,
             "kafka_bootstrap": metrics.kafka_bootstrap}
    return dataclasses.replace(settings, **{k: v for k, v in given.items() if v})


def render_report(settings: Settings, run_id: str) -> Path:
    """Write `<runs_dir>/<run_id>/report.html` and return its path."""
    t0 = time.monotonic()
    run_dir = run_folder_of(settings, run_id)
    if not run_dir.is_dir():
        raise ConfigError(f"run folder {run_dir} does not exist: check the run id (SLIPSTREAM_RUNS_DIR={settings.runs_dir})")
    raw = _load_json(run_dir / "metrics.json")
    doc = _Doc()
    metrics = RunMetrics()
    if raw is not None:
        try:
            metrics = parse_run_metrics(raw, str(run_dir / "metrics.json"))
        except SlipstreamError as e:
            doc.p(str(e), "bad")

    doc.h2("Summary", "summary")
    if raw is not None:
        m = metrics
        head = m.headline
        on = f"{m.auc_on} ({head.rows:,} rows, {head.users:,} users)" if head is not None else "–"
        auc = head.model.text() if head is not None and head.model is not None else "–"
        doc.table([("snapshot_id", m.snapshot_id), ("window", f"{m.window_start} to {m.t_handoff}"),
                   ("AUC", f"{auc} on {on}"), ("logistic baseline", head.baseline.text() if head and head.baseline else "–"),
                   ("logloss", _fmt(m.logloss)), ("chosen epoch", m.chosen_epoch), ("samples/s", _fmt(m.samples_per_s)),
                   ("data wait share", _fmt(m.data_wait_share)), ("checkpoint", m.checkpoint)], ("metric", "value"))
        if m.version < 2:
            doc.p(f"metrics.json of contract version {m.version}: written before evaluation sets carried their rows and "
                  "intervals; re-run the training for them.", "muted")
    else:
        doc.p("No metrics.json in the run folder: the run did not finish (or wrote elsewhere).", "bad")
    doc.end()

    doc.h2("Freshness", "freshness")
    if raw is not None:
        f = metrics.freshness
        live = f.live_prequential
        doc.table([
            ("newest event time trained on", metrics.newest_event_time or "unknown"),
            ("Kafka lag at stop (records)", metrics.kafka_lag_at_stop if metrics.kafka_lag_at_stop is not None else "unknown"),
            ("handoff time T", metrics.t_handoff or "unknown"),
            ("event → exported model, p50 / p99 (s)", f"{_fmt(f.event_to_export_s_p50)} / {_fmt(f.event_to_export_s_p99)} "
                                                     f"over {f.exports} export(s)"),
            ("live model's prequential AUC (since the previous export)",
             f"{live.model.text()} on {live.rows:,} rows" if live is not None and live.model is not None else "–"),
        ])
    else:
        doc.p("unknown (no metrics.json)", "muted")
    doc.end()

    window: _Window | None = None
    plan = read_plan(plan_path(run_dir)) if plan_path(run_dir).exists() else None
    if plan is not None or (metrics.snapshot_id is not None and metrics.window_start and metrics.t_handoff):
        try:
            window = _Window(settings, metrics, plan)
        except Exception as e:  # the report must still render what it can
            log.warning("could not read the Iceberg window of run %s: %s", run_id, e)
            doc.p(f"Could not read the Iceberg window: {e}", "bad")

    _model_sections(doc, run_dir, metrics)
    _quality_section(doc, settings, run_id)
    stream = FeatureProfile.read(run_dir / "stream_profile.json") if (run_dir / "stream_profile.json").exists() else None
    _audit_section(doc, settings, run_dir, metrics, window, plan.spec if plan is not None else None)
    _data_sections(doc, window, stream, metrics)

    curve = plots.training_curve(_load_jsonl(run_dir / "metrics.jsonl"))
    if curve:
        doc.h2("Training curve", "training")
        doc.img(curve, "training curve")
        doc.end()
    footer = (f'Rendered {datetime.now(timezone.utc).isoformat(timespec="seconds")} '
              f"in {time.monotonic() - t0:.1f}s by slipstream insight.")
    out = run_dir / REPORT_FILE
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(doc.render(run_id, footer))
    tmp.replace(out)
    log.info("wrote the insight report of run %s to %s (%.1fs)", run_id, out, time.monotonic() - t0)
    return out


def _quality_section(doc: _Doc, settings: Settings, run_id: str) -> None:
    doc.h2("Data-quality gate", "quality")
    try:
        res = read_results(get_catalog(settings), settings.namespace, run_id)
    except Exception as e:
        res = None
        doc.p(f"quality_results could not be read: {e}", "muted")
    if res is not None and res.num_rows:
        failed = res.filter(pc.invert(res.column("success"))).to_pylist()
        doc.p(f"{res.num_rows} expectations checked for this run, {len(failed)} failed.", "ok" if not failed else "bad")
        if failed:
            doc.table([(r["scope"], r["expectation"], r["severity"], r["observed"], r["expected"]) for r in failed],
                      ("scope", "expectation", "severity", "observed", "expected"))
    elif res is not None:
        doc.p("No quality-gate results recorded under this run id.", "muted")
    doc.end()


def _audit_section(doc: _Doc, settings: Settings, run_dir: Path, metrics: RunMetrics, window: _Window | None,
                   spec: Any = None) -> None:
    doc.h2("Exactly-once audit", "audit")
    audit = read_audit(run_dir)
    if audit is None:
        doc.p("No audit/rank-*.parquet in the run folder: nothing to verify.", "muted")
        doc.end()
        return
    if window is None:
        doc.p(f"{audit.num_rows:,} trained samples recorded, but the Iceberg window is unknown: cannot verify.", "muted")
        doc.end()
        return
    kafka = None
    start, end = _offsets(metrics.handoff_offsets), _offsets(metrics.final_offsets)
    notes = []
    if start and end and any(end.get(p, 0) > o for p, o in start.items()):
        own = run_settings(settings, metrics)
        topic, bootstrap = own.topic, own.kafka_bootstrap
        if not metrics.topic:
            notes.append(f"metrics.json does not name the run's topic (a run from before this was recorded): "
                         f"audited {topic} on {bootstrap}, the deployment's")
        try:
            kafka = read_kafka_range(KafkaAccess.from_settings(own), topic, start, end, spec=spec)
        except Exception as e:  # also a bad security setting: the rest of the report still renders
            notes.append(f"Kafka range could not be read from {bootstrap} ({e}): stream phase not verified.")
    else:
        notes.append("no stream phase (no Kafka offsets range in metrics.json)")
    result: AuditResult = audit_run(audit, window.ids, window.times, metrics.model_dump(mode="json", exclude_none=True),
                                    kafka)
    verdict = "exactly once: 0 lost, 0 duplicated" if result.exactly_once else "NOT exactly once"
    doc.p(verdict, "ok" if result.exactly_once else "bad")
    doc.table(
        [(s.source, s.epoch, f"{s.expected:,}", f"{s.trained_rows:,}", s.lost, s.duplicated, s.unexpected,
          ", ".join(s.lost_examples), ", ".join(s.duplicated_examples), ", ".join(s.unexpected_examples))
         for s in result.sources],
        ("source", "epoch", "expected", "trained rows", "lost", "duplicated", "unexpected", "lost ids", "duplicated ids", "unexpected ids"),
    )
    for n in notes + result.notes:
        doc.p(n, "muted")
    doc.end()

    doc.h2("Samples per source", "sources")
    rows = [(s, f"{n:,}") for s, n in sorted(result.per_source_rows.items())]
    rows += [(f"metrics.json {k}", f"{n:,}") for k, n in (
        ("samples_iceberg", metrics.samples_iceberg), ("samples_kafka", metrics.samples_kafka),
        ("dropped_before_t", metrics.dropped_before_t), ("dead_letters", metrics.dead_letters),
        ("forward_tail_stream (never trained)", metrics.forward_tail_stream))]
    doc.table(rows, ("source", "samples"))
    doc.end()

    doc.h2("Shuffle quality", "shuffle")
    if result.shuffle_score is None:
        doc.p("not enough batch-phase rows to score", "muted")
    else:
        doc.p(f"shuffle score {result.shuffle_score:.3f} (1 - |Spearman(step, event_time)| over the first epoch; "
              "1 = no trace of storage order, 0 = trained in time order)",
              "ok" if result.shuffle_score >= 0.9 else "bad")
    doc.end()


def _data_sections(doc: _Doc, window: _Window | None, stream: FeatureProfile | None, metrics: RunMetrics) -> None:
    doc.h2("Distributions", "distributions")
    if window is None:
        doc.p("Iceberg window unknown: no distributions.", "muted")
    else:
        doc.p(f"{window.profile.rows:,} window rows over {len(window.days)} days of the {window.spec.name} "
              f"spec's {len(window.spec.features)} features"
              + (f" (profiled now: {', '.join(map(str, window.profiled_here))})" if window.profiled_here else ""), "muted")
        if window.empty_days:
            doc.p("days without data: " + ", ".join(map(str, window.empty_days))
                  + " (no raw events: skipped by preprocessing, the window trained without them)", "bad")
        doc.img(plots.distributions(window.profile, stream, window.spec), "feature distributions")
    doc.end()

    doc.h2("Drift over days", "drift")
    series = window.drift_series() if window else {}
    if series and window is not None:
        features = sorted({s.feature for v in series.values() for s in v}, key=list(drift_features(window.spec)).index)
        doc.p(f"Each day with data against its trailing {window.history_days} days, per feature of the "
              f"{window.spec.name} spec: {', '.join(features)}.", "muted")
        doc.img(plots.drift_over_days(series), "drift over days")
        worst = [(str(d), s.feature, s.method, f"{s.score:.3f}") for d, v in series.items() for s in v if s.drifted]
        doc.table(worst or [("—", "no feature over its threshold", "", "")], ("day", "feature", "method", "score"))
    else:
        doc.p("Fewer than two profiled days: no drift series.", "muted")
    doc.end()

    doc.h2("CTR over time", "ctr")
    if window is not None:
        doc.img(plots.ctr_over_time(window.profile, stream, metrics.t_handoff), "CTR over time")
    else:
        doc.p("no data", "muted")
    doc.end()

    doc.h2("Batch-vs-stream skew", "skew")
    if stream is None:
        doc.p("no stream phase: the run has no stream_profile.json", "muted")
    elif window is None:
        doc.p("Iceberg window unknown: cannot compare with the stream.", "muted")
    else:
        shifts = compare_profiles(window.profile, stream, window.spec)
        doc.img(plots.skew_bars(shifts), "batch-vs-stream skew")
        doc.table([(s.feature, s.method, f"{s.score:.4f}", s.threshold, _num(s.mean_a), _num(s.mean_b),
                    f"{s.null_rate_a:.3%}", f"{s.null_rate_b:.3%}", "SKEW" if s.drifted else "ok") for s in shifts],
                  ("feature", "method", "score", "threshold", "mean (Iceberg)", "mean (Kafka)", "nulls (Iceberg)", "nulls (Kafka)", ""))
    doc.end()
