"""The quality suite, derived from the feature spec, and its validation with Great Expectations 1.x.

`build_checks` makes an expectation per feature by its kind (dense: finite and inside its
clip / scale range; integer ids: non-negative; categoricals: a sane distinct count; sequences:
at most `length` values and not mostly empty), plus the checks every data set has (schema, nulls,
binary label, unique ids, event times inside the interval, CTR and rows within the data set's
bounds, drift per feature). Each `Check` bounds one aggregate from `metrics` (a null count, a range end, the CTR, a drift
score...). The suite holds one `ExpectColumnMinToBeBetween` per check over a one-row pandas frame
of aggregates: GX validates in milliseconds however large the day is (GX evaluating row-level
expectations itself is what makes it take minutes on tens of millions of rows), and its
`observed_value` is the aggregate itself.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from slipstream.quality.bounds import GateBounds
from slipstream.quality.config import GateConfig
from slipstream.quality.metrics import Aggregates
from slipstream.samples.spec import FeatureSpec, Spec

log = logging.getLogger(__name__)

SUITE_NAME = "slipstream.samples"


@dataclass(frozen=True)
class Check:
    name: str
    """The expectation's name as people see it, e.g. `not_null.label`, `range.max.price_log`."""
    metric: str
    min_value: float | None
    max_value: float | None
    severity: str
    description: str
    bounds_from: str = ""
    """Where the bounds come from when they are the data set's (`spec`, `learned from N days`,
    `param gate_ctr_max`): shown with the expected value."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    severity: str
    success: bool
    observed: str
    """The observed value (and details, e.g. example duplicate ids), as text."""
    expected: str
    description: str

    def line(self) -> str:
        return f"{self.name} [{self.severity}]: observed {self.observed}, expected {self.expected}"


def build_checks(config: GateConfig, metrics: dict[str, float], spec: Spec, bounds: GateBounds) -> list[Check]:
    """The suite of `spec`'s samples: an expectation per feature by its kind, plus the checks every
    data set has; every check whose metric could be computed (others are reported as missing)."""
    sev = functools.partial(config.severity_of, data_set=spec.quality.severity)
    checks: list[Check] = [
        Check("schema", "schema_mismatches", 0, 0, sev("schema"), f"columns and types match the {spec.name} spec's samples"),
        Check("rows.nonempty", "row_count", 1, None, sev("rows.nonempty"),
              "the interval holds rows (none: was the day preprocessed and committed before this snapshot?)"),
    ]
    if "empty_days" in metrics:
        checks.append(Check("days.nonempty", "empty_days", 0, 0, sev("days.nonempty"),
                            "every day of the window holds rows (a day without raw events is skipped by preprocessing)"))
    if metrics.get("row_count") == 0:
        return checks  # nothing else can be measured on no rows; one clear failure says so
    for name in spec.sample_columns:
        checks.append(Check(f"not_null.{name}", f"nulls.{name}", 0, 0, sev(f"not_null.{name}"), f"{name} is never null"))
    for f in spec.features:
        checks += _feature_checks(f, spec, config, sev)
    checks += [
        Check("label.binary", "label_not_binary", 0, 0, sev("label.binary"), "label is 0 or 1"),
        Check("unique.sample_id", "duplicate_sample_ids", 0, 0, sev("unique.sample_id"), "sample_id is unique"),
        Check("event_time.in_interval", "events_outside_interval", 0, 0, sev("event_time.in_interval"),
              "every event_time lies inside the checked day/window"),
    ]
    q = spec.quality
    for name, metric, bound, what in (
        ("row_count.vs_expected", "row_count_ratio", bounds.row_count_ratio,
         "rows over the rows expected of the day (the history's median, weekday-aware) within bounds"),
        ("ctr", "ctr", bounds.ctr, f"label rate ({spec.label.describe()}) within bounds"),
    ):
        if bound.lo is not None or bound.hi is not None:
            checks.append(Check(name, metric, bound.lo, bound.hi, sev(name), what, bound.sources))
    # scored as `drift_days` scores them: Jensen–Shannon of categories and list lengths, PSI of
    # numbers, each with the day's own limit (chance at its size, the feature's usual movement)
    js_features = {f.name for f in spec.features if f.kind in ("categorical", "list", "sequence")}
    for metric in sorted(m for m in metrics if m.startswith("drift.")):
        feature = metric.split(".", 1)[1]
        kind = "Jensen–Shannon" if feature in js_features else "PSI"
        checks.append(Check(metric, metric, None, metrics.get(f"drift_limit.{feature}"), sev(metric),
                            f"{kind} of {feature} vs the trailing {q.history_days} days, within what chance at this size "
                            f"and its usual day-to-day movement allow"))
    return checks


def _feature_checks(f: FeatureSpec, spec: Spec, config: GateConfig, sev: Callable[[str], str]) -> list[Check]:
    """The expectations of one feature, by its kind."""
    out: list[Check] = []
    if f.kind == "dense":
        out.append(Check(f"finite.{f.name}", f"nonfinite.{f.name}", 0, 0, sev(f"finite.{f.name}"), f"{f.name} has no NaN/inf"))
        rng = f.dense_range()
        if rng is not None:
            # stored as float32: rounding is monotonic, so the float32 of a bound bounds the stored values
            lo, hi = (float(np.float32(x)) for x in rng)
            out.append(Check(f"range.min.{f.name}", f"min.{f.name}", lo, None, sev(f"range.min.{f.name}"),
                             f"{f.name} >= {lo:g} (clip / scale)"))
            out.append(Check(f"range.max.{f.name}", f"max.{f.name}", None, hi, sev(f"range.max.{f.name}"),
                             f"{f.name} <= {hi:g} (clip / scale)"))
    elif f.kind == "id" and integer_ids(spec, f):
        out.append(Check(f"range.min.{f.name}", f"min.{f.name}", 0, None, sev(f"range.min.{f.name}"), f"{f.name} >= 0"))
    elif f.kind == "categorical":
        most = max_distinct(spec, f)
        why = "quality.max_distinct" if f.name in spec.quality.max_distinct else "its buckets"
        out.append(Check(f"distinct.{f.name}", f"distinct.{f.name}", config.min_distinct, most, sev(f"distinct.{f.name}"),
                         f"{f.name} cardinality is sane" + (f" (at most {most:,}: {why})" if most else "")))
    elif f.kind == "sequence":
        out.append(Check(f"sequence.max_length.{f.name}", f"max_length.{f.name}", 0, f.length,
                         sev(f"sequence.max_length.{f.name}"),
                         f"{f.name} holds at most {f.length} values"))
        out.append(Check(f"sequence.empty_fraction.{f.name}", f"empty_fraction.{f.name}", 0, config.max_empty_history_fraction,
                         sev(f"sequence.empty_fraction.{f.name}"), f"most rows have some {f.name}"))
    return out


def integer_ids(spec: Spec, f: FeatureSpec) -> bool:
    """Whether an id feature keeps its raw integer ids (string ids are hashed)."""
    src = spec.events if f.table is None else spec.source(f.table)
    return src.field(f.column).type in ("long", "int")


def max_distinct(spec: Spec, f: FeatureSpec) -> int | None:
    """A categorical's most distinct values a day may have: `quality.max_distinct.<feature>`, else
    its embedding table's rows (more values than rows: collisions)."""
    if f.name in spec.quality.max_distinct:
        return int(spec.quality.max_distinct[f.name])
    return spec.feature(spec.table_of(f)).buckets


def _expected(c: Check) -> str:
    if c.min_value is not None and c.max_value is not None:
        text = f"== {c.min_value:g}" if c.min_value == c.max_value else f"in [{c.min_value:.4g}, {c.max_value:.4g}]"
    elif c.min_value is not None:
        text = f">= {c.min_value:.4g}"
    elif c.max_value is not None:
        text = f"<= {c.max_value:.4g}"
    else:
        text = "any"
    return f"{text} ({c.bounds_from})" if c.bounds_from else text


def _fmt(value: Any) -> str:
    x = float(value)
    if x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.6g}"


def _new_context() -> Any:
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    return context


_CACHE_LOCK = threading.Lock()


def _cached_batch_definition() -> Any:
    """One ephemeral GX context per process for every validation: creating a
    context and data source per gate costs more than validating. Built once, under a lock
    (`warm_up` may be building it in another thread)."""
    with _CACHE_LOCK:
        return _build_cached_batch_definition()


@functools.lru_cache(maxsize=1)
def _build_cached_batch_definition() -> Any:
    return (
        _new_context().data_sources.add_pandas("aggregates")
        .add_dataframe_asset("samples_aggregates")
        .add_batch_definition_whole_dataframe("whole")
    )


def warm_up() -> None:
    """Import Great Expectations and build the cached context and pandas data source: the first
    validation in a process otherwise pays for them (seconds). `run_gate` calls this in a thread
    while it reads and profiles the data."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations  # noqa: F401

    import slipstream.quality.gx_views  # noqa: F401  (GX's Data Docs renderers and views)

    _cached_batch_definition()


def _view(class_name: str) -> dict[str, str]:
    """GX's page views with compiled templates shared across builds (`gx_views`): same HTML."""
    return {"module_name": "slipstream.quality.gx_views", "class_name": class_name}


@dataclass(frozen=True)
class Validation:
    results: list[CheckResult]
    """One per check, in the order of the checks."""
    outcome: Any = None
    """GX's `ExpectationSuiteValidationResult` (None when no check could run): the input of
    `write_data_docs`."""


def validate(checks: list[Check], agg: Aggregates) -> Validation:
    """Run the suite with Great Expectations over the one-row frame of aggregates, with the
    process's cached context and data source (`warm_up`)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    import pandas as pd

    results: list[CheckResult] = []
    runnable = []
    for c in checks:
        value = agg.values.get(c.metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            why = "column missing" if agg.values.get("schema_mismatches") else "not computed (no rows)"
            if c.metric == "row_count_ratio":
                results.append(CheckResult(c.name, c.severity, True, "no trailing history", _expected(c), c.description))
            else:
                results.append(CheckResult(c.name, c.severity, False, why, _expected(c), c.description))
            continue
        runnable.append(c)
    if not runnable:
        return Validation(results)

    frame = pd.DataFrame({c.metric: [float(agg.values[c.metric])] for c in runnable})
    # Built in one go: adding 48 expectations one by one costs ~0.1 s of GX bookkeeping.
    suite = gx.ExpectationSuite(
        name=SUITE_NAME,
        expectations=[
            gx.expectations.ExpectColumnMinToBeBetween(  # type: ignore[attr-defined]  # great_expectations.expectations re-exports it without __all__
                column=c.metric, min_value=c.min_value, max_value=c.max_value,
                meta={"check": c.name, "severity": c.severity, "description": c.description},
            )
            for c in runnable
        ],
    )
    outcome = _cached_batch_definition().get_batch(batch_parameters={"dataframe": frame}).validate(suite)
    by_check = {r.expectation_config.meta["check"]: r for r in outcome.results}
    for c in runnable:
        r = by_check[c.name]
        info = r.exception_info if isinstance(r.exception_info, dict) else {}
        if info.get("raised_exception"):
            observed = f"error: {info.get('exception_message')}"
            success = False
        else:
            observed = _fmt(r.result.get("observed_value"))
            success = bool(r.success)
        if c.metric in agg.details:
            observed += f" ({agg.details[c.metric]})"
        results.append(CheckResult(c.name, c.severity, success, observed, _expected(c), c.description))
    order = {c.name: i for i, c in enumerate(checks)}
    results.sort(key=lambda r: order[r.name])
    return Validation(results, outcome)


def write_data_docs(validation: Validation, docs_dir: Path, name: str) -> Path | None:
    """Render GX Data Docs of a validation (static HTML) under `docs_dir`; returns its
    `index.html`, or None when no check ran. `name` names the batch in the docs.

    The validation result goes straight into a fresh context's result store and GX's site
    builder renders it: the page a checkpoint with `UpdateDataDocsAction` renders, without the
    checkpoint's bookkeeping (storing and re-comparing the suite, the validation definition and
    the checkpoint itself: ~0.2 s per gate)."""
    if validation.outcome is None:
        return None
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    context = _new_context()
    context.add_data_docs_site(
        site_name="slipstream",
        site_config={
            "class_name": "SiteBuilder",
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder", "view": _view("CachedJinjaIndexPageView")},
            # the validation page already lists every expectation with its result
            "site_section_builders": {
                "expectations": "0", "profiling": "0",
                "validations": {"view": _view("CachedJinjaPageView")},
            },
        },
    )
    outcome = validation.outcome
    run_id = RunIdentifier(run_time=datetime.now(UTC))
    # what a checkpoint's validation records in the result's meta
    outcome.meta["run_id"] = run_id
    outcome.meta["validation_time"] = run_id.run_time
    outcome.meta["batch_parameters"] = {"dataframe": "<DATAFRAME>"}
    key = ValidationResultIdentifier(
        batch_identifier=f"aggregates-{name}",
        expectation_suite_identifier=ExpectationSuiteIdentifier(name=SUITE_NAME),
        run_id=run_id,
    )
    context.validation_results_store.set(key, outcome)
    context.build_data_docs(site_names=["slipstream"], resource_identifiers=[key], build_index=True)
    index = docs_dir / "index.html"
    return index if index.exists() else None
