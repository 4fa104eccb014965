"""The insight report of a training run: one static HTML file, `<runs_dir>/<run_id>/report.html`.

What went in (distributions, CTR over time, drift across the window's days, batch-vs-stream skew
on comparable rows), how fresh it was, whether every sample was trained exactly once, how well the
batch phase was shuffled, and how the model compares with its baselines on every evaluation set
(each AUC with its rows and interval: the prequential stream, the forward tail that decides
promotion). It works from the run folder, the pinned Iceberg snapshot and the stored
`sample_profiles`; every optional piece that is missing becomes a sentence in its section, never
an error.

The summary at the top lists the run's findings (`report_doc.Finding`): each in the words its
section uses, red ones with one line on what to do.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from slipstream.errors import ConfigError, SlipstreamError
from slipstream.lake.iceberg import get_catalog
from slipstream.pipeline.run_metrics import RunMetrics, parse_run_metrics
from slipstream.pipeline.runlayout import REPORT_FILE
from slipstream.pipeline.runlayout import run_dir as run_folder_of
from slipstream.pipeline.runplan import plan_path, read_plan
from slipstream.quality.audit import AuditResult, audit_run, read_audit, read_kafka_range, stream_audit_start
from slipstream.quality.profiles import FeatureProfile
from slipstream.quality.report_data import (
    Window,
    ctr_section,
    distributions_section,
    drift_finding,
    drift_lines,
    drift_section,
    empty_days_finding,
    skew_finding,
    skew_result,
    skew_section,
)
from slipstream.quality.report_doc import Finding, ReportDoc, findings_table
from slipstream.quality.report_ids import id_tables_section
from slipstream.quality.report_model import (
    freshness_section,
    model_finding,
    model_section,
    promotion_finding,
    summary_facts,
    training_section,
)
from slipstream.quality.store import read_results
from slipstream.quality.wording import AUDIT_ACTION, SHUFFLE_ACTION, action_for
from slipstream.settings import Settings
from slipstream.stream.kafka import KafkaAccess

log = logging.getLogger(__name__)

SHUFFLE_OK = 0.9


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def _offsets(raw: Any) -> dict[int, int]:
    return {int(k): int(v) for k, v in (raw or {}).items()}


def run_settings(settings: Settings, metrics: dict[str, Any]) -> Settings:
    """The settings the run itself used, as far as metrics.json records them (a run may set its own
    catalog, namespace, topic or broker: the report must audit those, not the deployment's defaults)."""
    given = {"catalog": metrics.get("catalog"), "namespace": metrics.get("namespace"),
             "topic": metrics.get("topic"), "kafka_bootstrap": metrics.get("kafka_bootstrap")}
    return dataclasses.replace(settings, **{k: v for k, v in given.items() if v})


def render_report(settings: Settings, run_id: str) -> Path:
    """Write `<runs_dir>/<run_id>/report.html` and return its path."""
    t0 = time.monotonic()
    run_dir = run_folder_of(settings, run_id)
    if not run_dir.is_dir():
        raise ConfigError(f"run folder {run_dir} does not exist: check the run id (SLIPSTREAM_RUNS_DIR={settings.runs_dir})")
    metrics: dict[str, Any] = _load_json(run_dir / "metrics.json") or {}
    typed, contract_error = RunMetrics(), ""
    if metrics:  # the model's numbers come from the typed contract; the rest reads the keys
        try:
            typed = parse_run_metrics(metrics, str(run_dir / "metrics.json"))
        except SlipstreamError as e:
            contract_error = str(e)
    window: Window | None = None
    window_error = ""
    plan = read_plan(plan_path(run_dir)) if plan_path(run_dir).exists() else None
    if plan is not None or all(k in metrics for k in ("snapshot_id", "window_start", "t_handoff")):
        try:
            window = Window(run_settings(settings, metrics), metrics, plan)
        except Exception as e:  # the report must still render what it can
            log.warning("could not read the Iceberg window of run %s: %s", run_id, e)
            window_error = f"Could not read the Iceberg window: {e}"
    stream = FeatureProfile.read(run_dir / "stream_profile.json") if (run_dir / "stream_profile.json").exists() else None

    # every finding first: the summary states them in the words their sections use
    model = model_finding(typed)
    decision = (_load_json(run_dir / "summary.json") or {}).get("publish")
    promotion = promotion_finding(decision, model)
    gate, failed = _gate_results(settings, run_id)
    audit = _audit(settings, run_dir, metrics, window, plan.spec if plan is not None else None)
    series, lines = drift_lines(window)
    drift = drift_finding(lines, window)
    skew, why_not = skew_result(window, stream)
    skew_f = skew_finding(skew, why_not)
    empty = empty_days_finding(window) if window is not None else None
    findings = [f for f in (model, promotion, gate, audit[0], audit[1], drift, skew_f, empty) if f is not None]

    doc = ReportDoc()
    doc.h2("Summary", "summary")
    if not metrics:
        doc.p("No metrics.json in the run folder: the run did not finish (or wrote elsewhere).", "bad")
    if window_error:
        doc.p(window_error, "bad")
    if contract_error:
        doc.p(contract_error, "bad")
    elif metrics and typed.version < 2:
        doc.p(f"metrics.json of contract version {typed.version}: written before evaluation sets carried their rows and "
              "intervals; re-run the training for them.", "muted")
    findings_table(doc, findings)
    facts = summary_facts(metrics, typed)
    if facts:
        doc.table(facts, ("", "value"))
    doc.end()
    freshness_section(doc, metrics, typed)
    model_section(doc, typed, model, promotion, decision)
    id_tables_section(doc, metrics)
    _quality_section(doc, gate, failed)
    _audit_section(doc, audit, metrics)
    distributions_section(doc, window, stream, empty)
    drift_section(doc, window, series, lines, drift)
    ctr_section(doc, window, stream, metrics)
    skew_section(doc, skew, skew_f, window.spec if window else None)
    training_section(doc, run_dir, metrics)
    footer = (f'Rendered {datetime.now(UTC).isoformat(timespec="seconds")} '
              f"in {time.monotonic() - t0:.1f} s by slipstream insight.")
    out = run_dir / REPORT_FILE
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(doc.render(run_id, footer))
    tmp.replace(out)
    log.info("wrote the insight report of run %s to %s (%.1fs)", run_id, out, time.monotonic() - t0)
    return out


def _gate_results(settings: Settings, run_id: str) -> tuple[Finding, list[dict[str, Any]]]:
    """The gate's finding for this run id, and its failed expectations."""
    try:
        res = read_results(get_catalog(settings), settings.namespace, run_id)
    except Exception as e:
        return Finding("Quality gate", f"Quality gate: quality_results could not be read ({e}).", None, anchor="quality"), []
    if not res.num_rows:
        return Finding("Quality gate", "Quality gate: no results recorded under this run id.", None, anchor="quality"), []
    failed = res.filter(pc.invert(res.column("success"))).to_pylist()
    if not failed:
        return Finding("Quality gate", f"Quality gate: {res.num_rows} expectations checked for this run, 0 failed.", True,
                       anchor="quality"), []
    names = ", ".join(dict.fromkeys(f"{r['expectation']} ({r['severity']})" for r in failed))
    return Finding("Quality gate", f"Quality gate: {res.num_rows} expectations checked for this run, {len(failed)} failed: "
                                   f"{names}.", False, "See each failed expectation below, with what to do about it.",
                   "quality"), failed


def _quality_section(doc: ReportDoc, gate: Finding, failed: list[dict[str, Any]]) -> None:
    doc.h2("Data-quality gate", "quality")
    doc.finding(gate)
    if failed:
        doc.table([(r["scope"], r["expectation"], r["severity"], r["observed"], r["expected"], action_for(r["expectation"]))
                   for r in failed], ("scope", "expectation", "severity", "observed", "expected", "what to do"),
                  ["bad"] * len(failed))
    doc.end()


def _audit(settings: Settings, run_dir: Path, metrics: dict[str, Any], window: Window | None,
           spec: Any = None) -> tuple[Finding, Finding | None, AuditResult | None, list[str]]:
    """(exactly-once finding, shuffle finding, the audit, notes)."""
    audit = read_audit(run_dir)
    if audit is None:
        return Finding("Exactly once", "Exactly once: no audit/rank-*.parquet in the run folder, nothing to verify.", None,
                       anchor="audit"), None, None, []
    if window is None:
        return Finding("Exactly once", f"Exactly once: {audit.num_rows:,} trained samples recorded, but the Iceberg window "
                                       "is unknown: cannot verify.", None, anchor="audit"), None, None, []
    kafka = None
    start, end = _offsets(metrics.get("handoff_offsets")), _offsets(metrics.get("final_offsets"))
    # up to the committed end when the stream phase stopped: what the run should have read
    stop = _offsets(metrics.get("stop_offsets")) or end
    stop = {p: max(o, end.get(p, 0)) for p, o in stop.items()}
    notes = []
    unverified = ""
    if start and stop and any(stop.get(p, 0) > o for p, o in start.items()):
        own = run_settings(settings, metrics)
        topic, bootstrap = own.topic, own.kafka_bootstrap
        if "topic" not in metrics:
            notes.append(f"metrics.json does not name the run's topic (a run from before this was recorded): "
                         f"audited {topic} on {bootstrap}, the deployment's")
        try:
            access = KafkaAccess.from_settings(own)
            if metrics.get("window_start"):  # from the window's start: the records skipped as "before T" are checked too
                start = stream_audit_start(access, topic, datetime.fromisoformat(metrics["window_start"]), start)
            kafka = read_kafka_range(access, topic, start, stop, spec=spec)
        except Exception as e:  # also a bad security setting: the rest of the report still renders
            unverified = f"the committed records of its Kafka range could not be read from {bootstrap} ({e})"
    else:
        notes.append("no stream phase (no Kafka offsets range in metrics.json)")
    result: AuditResult = audit_run(audit, window.ids, window.times, metrics, kafka)
    lost = sum(s.lost for s in result.sources)
    dup = sum(s.duplicated for s in result.sources)
    if unverified:
        once = Finding("Exactly once", f"NOT verified: {unverified}.", False, AUDIT_ACTION, "audit")
    elif result.exactly_once:
        once = Finding("Exactly once", "Exactly once: 0 lost, 0 duplicated.", True, anchor="audit")
    else:
        once = Finding("Exactly once", f"NOT exactly once: {lost:,} lost, {dup:,} duplicated, "
                                       f"{sum(s.unexpected for s in result.sources):,} unexpected.", False, AUDIT_ACTION, "audit")
    shuffle = None
    if result.shuffle_score is not None:
        ok = result.shuffle_score >= SHUFFLE_OK
        shuffle = Finding("Shuffle", f"Shuffle score {result.shuffle_score:.3f} (1 − |Spearman(step, event_time)| over the first "
                                     "epoch; 1 = no trace of storage order, 0 = trained in time order).", ok,
                          "" if ok else SHUFFLE_ACTION, "shuffle")
    return once, shuffle, result, notes


def _audit_section(doc: ReportDoc, audit: tuple[Finding, Finding | None, AuditResult | None, list[str]],
                   metrics: dict[str, Any]) -> None:
    once, shuffle, result, notes = audit
    counts = {k: int(metrics[k]) for k in ("samples_iceberg", "samples_kafka", "dropped_before_t", "dead_letters",
                                           "duplicates", "forward_tail_stream")
              if isinstance(metrics.get(k), (int, float))}
    doc.h2("Exactly-once audit", "audit")
    doc.finding(once)
    if result is not None:
        doc.table(
            [(s.source, s.epoch, f"{s.expected:,}", f"{s.trained_rows:,}", s.lost, s.duplicated, s.unexpected,
              ", ".join(s.lost_examples), ", ".join(s.duplicated_examples), ", ".join(s.unexpected_examples),
              "; ".join(s.lost_where), f"{s.unread:,}" + (f" ({'; '.join(s.unread_where)})" if s.unread_where else ""))
             for s in result.sources],
            ("source", "epoch", "expected", "trained rows", "lost", "duplicated", "unexpected", "lost ids", "duplicated ids",
             "unexpected ids", "lost records (partition, offsets)", "unread at stop"),
            ["" if s.exactly_once else "bad" for s in result.sources])
        if result.committed_lag is not None:
            per_partition = ", ".join(f"partition {p}: {n:,}" for p, n in result.committed_lag.items())
            doc.p(f"Lag at the stop, from committed records (a fresh reader's count after each partition's final "
                  f"position): {sum(result.committed_lag.values()):,} ({per_partition})", "muted")
    for n in notes + (result.notes if result is not None else []):
        doc.p(n, "muted")
    doc.end()
    if result is None:
        return
    doc.h2("Samples per source", "sources")
    doc.table([(s, f"{n:,} rows") for s, n in sorted(result.per_source_rows.items())]
              + [(f"metrics.json {k}" + (" (never trained)" if k == "forward_tail_stream" else ""), f"{v:,} rows")
                 for k, v in counts.items()], ("source", "samples"))
    doc.end()
    doc.h2("Shuffle quality", "shuffle")
    if shuffle is None:
        doc.p("not enough batch-phase rows to score", "muted")
    else:
        doc.finding(shuffle)
    doc.end()
