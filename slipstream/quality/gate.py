"""The quality gate: validate a day (or the training window) of `samples` at a pinned snapshot.

Reads the interval's files columnar, profiles them once (`profiles`), turns profile + a few
pyarrow kernels into aggregates (`metrics`), compares row counts and distributions with the
trailing days (manifest row counts, stored `sample_profiles`), and validates the aggregates with
the Great Expectations suite (`suites`). Results go to the Iceberg table `quality_results` and a
static HTML page under `<runs_dir>/<run_id>/quality/`; a critical failure raises
`QualityGateFailed` naming every failed expectation with its observed value.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np

from slipstream.errors import ConfigError, QualityGateFailed
from slipstream.lake.iceberg import get_catalog
from slipstream.lake.planning import WindowFile, pin_snapshot
from slipstream.pipeline.runlayout import run_dir
from slipstream.quality.bounds import GateOverrides, expected_rows, learn_bounds, resolve_bounds
from slipstream.quality.config import GateConfig
from slipstream.quality.day_profiles import profile_window
from slipstream.quality.docs_html import render_gate_html
from slipstream.quality.drift import FeatureShift
from slipstream.quality.drift_days import drift_over_days
from slipstream.quality.gate_result import GateResult
from slipstream.quality.metrics import Aggregates, compute_aggregates, duplicate_ids
from slipstream.quality.profiles import PARALLEL_MIN_ROWS, FeatureProfile, run_parallel
from slipstream.quality.reading import day_bounds, day_row_counts, load_samples, read_interval
from slipstream.quality.store import (
    label_rate,
    read_profile_docs,
    stored_profile_days,
    write_profile,
    write_profiles,
    write_results,
)
from slipstream.quality.suites import build_checks, validate, warm_up, write_data_docs
from slipstream.quality.wording import shift_detail
from slipstream.samples.spec import Spec
from slipstream.settings import Settings

log = logging.getLogger(__name__)

GATE_THREADS = 2
"""Threads for the duplicate-id check and the profile's column jobs (numpy and Arrow release
the GIL). More than the cores only adds switching."""


def _interval(day: date | None, window: tuple[datetime, datetime] | None) -> tuple[str, datetime, datetime, date | None]:
    if (day is None) == (window is None):
        raise ConfigError("run_gate needs exactly one of day=... or window=(start, end)")
    if day is not None:
        start, end = day_bounds(day)
        return f"day:{day.isoformat()}", start, end, day
    assert window is not None  # exactly one of day and window, checked above
    start, end = window
    if start.tzinfo is None or end.tzinfo is None or not start < end:
        raise ConfigError(f"window must be two timezone-aware datetimes, start < end; got {start!r}, {end!r}")
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    return f"window:{start.isoformat()}/{end.isoformat()}", start, end, None


def window_rows_ratio(window_counts: dict[date, int]) -> tuple[float, date] | None:
    """Window mode: the day furthest from the window's median daily rows (log scale), as a ratio
    to that median, and the day. None with fewer than two days with data."""
    if len(window_counts) < 2:
        return None
    median = float(np.median(list(window_counts.values())))
    d = max(window_counts, key=lambda k: abs(np.log(window_counts[k] / median)))
    return window_counts[d] / median, d


def days_of(start: datetime, end: datetime) -> list[date]:
    """The UTC days [start, end) touches."""
    out, d = [], start.date()
    while datetime(d.year, d.month, d.day, tzinfo=UTC) < end:
        out.append(d)
        d += timedelta(days=1)
    return out


@dataclass
class _History:
    """What the gate compares the interval with, from metadata and stored profiles only."""

    window_counts: dict[date, int] | None
    """Window mode: rows per day of the window (days with data)."""
    profiles: dict[date, FeatureProfile]
    """Stored profiles of the trailing days and of the days whose movement is the usual one
    (`movement.baseline_days` more): the drift reference and baseline."""
    counts: dict[date, int]
    """Rows per day of everything the bounds learn from."""
    ctrs: dict[date, float]
    """Label rate per day of the stored profiles the bounds learn from."""
    stored: set[date]
    """Window mode: the window's days that have a stored profile already."""


def _read_history(catalog: Any, namespace: str, table: Any, snapshot_id: int, spec: Spec, config: GateConfig,
                  start: datetime, end: datetime, window: bool) -> _History:
    q = spec.quality
    drift_days = config.movement.baseline_days + q.history_days
    # rows per day of every day the bounds learn from, from the manifests alone
    counts = day_row_counts(table, snapshot_id, start - timedelta(days=max(q.learn_from_days, q.history_days)), start)
    counts.pop(start.date(), None)
    window_counts = day_row_counts(table, snapshot_id, start, end) if window else None
    first = (start - timedelta(days=max(q.learn_from_days, drift_days))).date()
    docs = read_profile_docs(catalog, namespace, first, start.date())
    profiles = {d: FeatureProfile.from_dict(doc) for d, doc in docs.items() if d >= (start - timedelta(days=drift_days)).date()}
    ctrs = {d: label_rate(doc) for d, doc in docs.items()} if q.learn_from_days else {}
    stored = stored_profile_days(catalog, namespace, start.date(), end.date() + timedelta(days=1)) if window else set()
    return _History(window_counts, profiles, counts, ctrs, stored)


def run_gate(
    settings: Settings,
    *,
    spec: Spec,
    day: date | None,
    window: tuple[datetime, datetime] | None,
    snapshot_id: int,
    run_id: str,
    config: GateConfig | None = None,
    overrides: GateOverrides | None = None,
    files: Sequence[WindowFile] | None = None,
) -> GateResult:
    """Validate `samples` of the data set `spec` for one day or one window at `snapshot_id`.
    `overrides`: this run's bounds (the DAG's params), over the learned and the spec's ones
    (`bounds`). `files`: the window's data files as the run's plan lists them (`RunPlan.files`),
    read instead of planning them again.

    Returns the result when every critical expectation passes (warnings are in `.warnings`);
    raises `QualityGateFailed` otherwise, after persisting the results and the HTML page.
    """
    config = config or GateConfig()
    scope, start, end, the_day = _interval(day, window)
    t0 = time.monotonic()
    # Importing GX and building its context (seconds, once per process) overlaps with the read.
    warm_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gate-gx")
    warm = warm_pool.submit(warm_up)
    warm_pool.shutdown(wait=False)
    timings: dict[str, float] = {}
    catalog = get_catalog(settings)
    table = load_samples(catalog, settings.namespace)
    pin_snapshot(table, snapshot_id)

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="gate") as pool:
        # Metadata (manifests, stored profiles) is read while the data is.
        hist = pool.submit(_read_history, catalog, settings.namespace, table, snapshot_id, spec, config, start, end,
                           the_day is None)
        absent: dict[str, int] = {}
        data = read_interval(table, snapshot_id, start, end, spec.sample_columns, files=files, absent=absent)
        timings["read"] = time.monotonic() - t0
        has_ids = "sample_id" in data.schema.names
        day_profiles: dict[date, FeatureProfile] = {}
        if the_day is None:
            # Window mode: the window's profile and the profiles of its days not stored yet come
            # from one grouped pass over each column (`profile_window`), while the duplicate-id
            # check (hash + sort, numpy without the GIL) runs on the pool.
            history = hist.result()
            dups = pool.submit(duplicate_ids, data.column("sample_id")) if has_ids else None
            day_profiles, profile = profile_window(data, spec, [d for d in days_of(start, end) if d not in history.stored])
            duplicates = dups.result() if dups is not None else None
        else:
            # The duplicate-id check goes first, then the profile's column jobs, on GATE_THREADS threads.
            profile = FeatureProfile.for_spec(spec)
            jobs: list[Callable[[], Any]] = profile.update_jobs(data)
            if has_ids:
                jobs.insert(0, functools.partial(duplicate_ids, data.column("sample_id")))
            done = run_parallel(jobs, parallel=data.num_rows >= PARALLEL_MIN_ROWS, threads=GATE_THREADS)
            duplicates = done[0] if has_ids else None
            history = hist.result()
        agg = compute_aggregates(data, profile, start, end, spec, duplicates, absent)
        for name, n in sorted(absent.items()):
            if n:
                log.warning("%s: %s of %s rows were written before the spec had %s: they take its default",
                            scope, f"{n:,}", f"{data.num_rows:,}", name)
        timings["profile"] = time.monotonic() - t0 - timings["read"]

    mark = time.monotonic()
    _history_metrics(agg, history, spec, config, data.num_rows, start, end, the_day)
    drift = _day_drift(agg, history, spec, config, profile, the_day) if the_day is not None and data.num_rows else []
    learned = learn_bounds(spec.quality, config, history.counts, history.ctrs, start.date(), rows=data.num_rows)
    bounds = resolve_bounds(spec.quality, learned, overrides or GateOverrides())
    timings["history"] = time.monotonic() - mark

    out_dir = run_dir(settings, run_id) / "quality"
    slug = scope.replace(":", "_").replace("/", "_").replace("+00:00", "Z")
    docs_dir = out_dir / "gx_data_docs" / slug if config.data_docs else None
    if docs_dir is not None and docs_dir.exists():
        shutil.rmtree(docs_dir)  # a re-run replaces its docs, like its rows in quality_results

    # Validation, the two Iceberg commits and GX's Data Docs are all Python bound by the GIL: one
    # after the other is faster than side by side on threads (measured: the gate's median 1.60 s
    # against 1.75 s, 12 alternating gates on the bench's 5M-row day).
    mark = time.monotonic()
    warm.result()
    validation = validate(build_checks(config, agg.values, spec, bounds), agg)
    results = validation.results
    timings["validate"] = time.monotonic() - mark
    mark = time.monotonic()
    if the_day is not None:
        write_profile(catalog, settings.namespace, day=the_day, snapshot_id=snapshot_id, run_id=run_id, profile=profile)
    else:
        write_profiles(catalog, settings.namespace, day_profiles, snapshot_id=snapshot_id, run_id=run_id)
    write_results(catalog, settings.namespace, run_id=run_id, scope=scope, day=the_day, snapshot_id=snapshot_id, results=results)
    timings["persist"] = time.monotonic() - mark
    data_docs = None
    if docs_dir is not None:
        mark = time.monotonic()
        data_docs = write_data_docs(validation, docs_dir, slug)
        timings["data_docs"] = time.monotonic() - mark

    result = GateResult(run_id, scope, snapshot_id, start, end, data.num_rows, results, drift, profile=profile)
    result.timings = timings
    result.data_docs = data_docs
    result.bounds = bounds
    result.empty_days = _empty_days(history, start, end)
    result.seconds = time.monotonic() - t0
    out_dir.mkdir(parents=True, exist_ok=True)
    result.html_path = out_dir / f"{slug}.html"
    result.html_path.write_text(render_gate_html(result))
    _report(result, snapshot_id)
    return result


def _history_metrics(agg: Aggregates, history: _History, spec: Spec, config: GateConfig, rows: int, start: datetime,
                     end: datetime, the_day: date | None) -> None:
    """The row-count ratio (day mode: against the rows expected of the day; window mode: the day
    furthest from the window's median), and the window's days without rows."""
    if the_day is not None:
        exp = expected_rows(spec.quality, config, history.counts, the_day)
        if exp is not None:
            agg.values["row_count_ratio"] = rows / exp.rows
            agg.details["row_count_ratio"] = f"{rows:,} rows vs {exp.rows:,.0f} expected: {exp.how}"
        return
    assert history.window_counts is not None
    furthest = window_rows_ratio({d: n for d, n in history.window_counts.items() if n})
    if furthest is not None:
        agg.values["row_count_ratio"] = furthest[0]
        agg.details["row_count_ratio"] = f"{furthest[1]}: {history.window_counts[furthest[1]]:,} rows vs the window's median day"
    empty = _empty_days(history, start, end)
    agg.values["empty_days"] = float(len(empty))
    if empty:
        agg.details["empty_days"] = "days without data: " + ", ".join(map(str, empty))


def _day_drift(agg: Aggregates, history: _History, spec: Spec, config: GateConfig, profile: FeatureProfile,
               the_day: date) -> list[FeatureShift]:
    """Each feature of the day against its trailing days, judged by its usual movement."""
    verdicts = drift_over_days({**history.profiles, the_day: profile}, [the_day], spec, spec.quality.history_days,
                               config.movement).get(the_day, [])
    for s in verdicts:
        if s.score == s.score:
            agg.values[f"drift.{s.feature}"] = s.score
            agg.values[f"drift_limit.{s.feature}"] = s.threshold
            agg.details[f"drift.{s.feature}"] = shift_detail(s)
    return verdicts


def _empty_days(history: _History, start: datetime, end: datetime) -> list[date]:
    """Window mode: the window's days that hold no rows at the snapshot."""
    if history.window_counts is None:
        return []
    return [d for d in days_of(start, end) if not history.window_counts.get(d)]


def _report(result: GateResult, snapshot_id: int) -> None:
    """Log the outcome; raise `QualityGateFailed` naming each failed critical expectation."""
    scope = result.scope
    for w in result.warnings:
        log.warning("quality warning %s: %s", scope, w.line())
    log.info(
        "quality gate %s at snapshot %s: %d rows, %d critical failures, %d warnings, %.2fs (%s; %s)",
        scope, snapshot_id, result.rows, len(result.critical_failures), len(result.warnings),
        result.seconds, ", ".join(f"{k} {v:.2f}s" for k, v in result.timings.items()), result.html_path,
    )
    if result.critical_failures:
        lines = "\n  ".join(r.line() for r in result.critical_failures)
        err = QualityGateFailed(
            f"quality gate failed for {scope} (snapshot {snapshot_id}, run {result.run_id}): "
            f"{len(result.critical_failures)} critical expectation(s) failed:\n  {lines}\n"
            f"Fix the data (re-run preprocessing for the day), or relax the bound: the spec's `quality:` "
            f"section for the data set, the DAG params gate_ctr_min/max and gate_rows_ratio_min/max for "
            f"this run (docs/quality.md); details: {result.html_path}"
        )
        err.result = result
        raise err
