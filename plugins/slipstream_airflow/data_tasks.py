"""Work behind `preprocess_samples` and `cache_warmup` (one day or a backfilled range; the recent
window) of one data set."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from slipstream.errors import ConfigError
from slipstream.pipeline.datasets import DatasetRef
from slipstream.pipeline.runlayout import RunInfo, run_dir, write_run_info
from slipstream_airflow.callbacks import fail_fast

log = logging.getLogger(__name__)


@fail_fast
def raw_ready(day: Any, attribution_s: int, dataset: DatasetRef) -> bool:
    """Sensor poke: the raw day is complete once its click attribution window has passed. A raw
    zone that holds another data set's sources fails the sensor at once (DatasetMismatch)."""
    from slipstream.pipeline.datasets import check_raw_zone
    from slipstream.pipeline.preprocess_launch import raw_day_ready
    from slipstream.samples.spec import load_spec

    settings = dataset.settings()
    spec = load_spec(settings.spec)
    check_raw_zone(settings, spec)
    labels = spec.label_source
    ready = bool(raw_day_ready(settings.raw_dir, day, attribution_s, io_properties=settings.s3_io_properties(),
                               events=spec.events.name, labels=labels.name if labels is not None else None))
    log.info("raw day %s under %s ready: %s", day, settings.raw_dir, ready)
    return ready


def preprocess_run_id(day: Any, dataset: DatasetRef | None = None) -> str:
    """One run id per day (and data set): a re-run or a backfill of the day replaces its rows and
    its gate results."""
    return f"{dataset.run_kind('preprocess') if dataset else 'preprocess'}-{day:%Y%m%d}"


@dataclass(frozen=True)
class DayRange:
    """The days a `preprocess_samples` run builds: its own day, or the `range_from`..`range_to`
    params (both ends included) of a range backfill."""

    first: date
    last: date

    @classmethod
    def of_run(cls, day: date, params: Mapping[str, Any] | None) -> DayRange:
        params = params or {}
        lo, hi = params.get("range_from"), params.get("range_to")
        if not lo and not hi:
            return cls(day, day)
        if not lo or not hi:
            raise ConfigError(f"a range backfill needs both range_from and range_to (YYYY-MM-DD), got {lo!r} and {hi!r}")
        try:
            first, last = date.fromisoformat(str(lo)), date.fromisoformat(str(hi))
        except ValueError:
            raise ConfigError(f"range_from and range_to must be days (YYYY-MM-DD), got {lo!r} and {hi!r}") from None
        if first > last:
            raise ConfigError(f"range_from {first} is after range_to {last}: give the first day, then the last")
        return cls(first, last)

    @property
    def days(self) -> list[date]:
        return [self.first + timedelta(days=i) for i in range((self.last - self.first).days + 1)]

    def run_id(self, dataset: DatasetRef | None = None) -> str:
        """The day's run id, or one per range: a re-run of the same range replaces its gate results."""
        if self.first == self.last:
            return preprocess_run_id(self.first, dataset)
        return f"{preprocess_run_id(self.first, dataset)}-{self.last:%Y%m%d}"

    def window(self) -> tuple[datetime, datetime]:
        start = datetime(self.first.year, self.first.month, self.first.day, tzinfo=UTC)
        return start, start + timedelta(days=(self.last - self.first).days + 1)


@fail_fast
def preprocess_days(day: Any, dag_run_id: str, dataset: DatasetRef,
                    params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Replace the run's day, or every day of its range params, in ONE Spark job (idempotent: a
    re-run rewrites the same days), once the table is checked to be the data set's. Returns small
    counts and the snapshot that holds them all."""
    from slipstream.pipeline.datasets import open_dataset_table
    from slipstream.pipeline.preprocess_launch import run_preprocess_days
    from slipstream.samples.spec import load_spec

    span = DayRange.of_run(day, params)
    if span.first == span.last:
        return preprocess_day(span.first, dag_run_id, dataset)
    settings = dataset.settings()
    open_dataset_table(settings, load_spec(settings.spec))
    run_id = span.run_id(dataset)
    write_run_info(run_dir(settings, run_id), RunInfo(dag_id=dataset.dag_id("preprocess_samples"), dag_run_id=dag_run_id,
                                                      dataset=settings.dataset, reason=f"days {span.first}..{span.last}"))
    results = run_preprocess_days(settings, span.days, run_id)
    committed = [r.snapshot_id for r in results if r.snapshot_id is not None]
    empty = [str(r.day) for r in results if r.empty]
    rows, rejects = sum(r.rows for r in results), sum(r.rejects for r in results)
    # passes commit in day order: the last one's snapshot holds every day of the range
    snapshot = int(committed[-1]) if committed else None
    log.info("days %s..%s: %d rows, %d rejects, %d days without raw events, snapshot %s (DAG run %s)", span.first,
             span.last, rows, rejects, len(empty), snapshot, dag_run_id)
    return {"range_from": str(span.first), "range_to": str(span.last), "days": len(results), "snapshot_id": snapshot,
            "rows": rows, "rejects": rejects, "empty": not committed, "empty_days": len(empty)}


@fail_fast
def preprocess_day(day: Any, dag_run_id: str, dataset: DatasetRef) -> dict[str, Any]:
    """Replace one day in the data set's `samples` (idempotent: a re-run or a backfill rewrites the
    same day), once its table is checked to be the data set's."""
    from slipstream.pipeline.datasets import open_dataset_table
    from slipstream.pipeline.preprocess_launch import run_preprocess
    from slipstream.samples.spec import load_spec

    settings = dataset.settings()
    open_dataset_table(settings, load_spec(settings.spec))
    run_id = preprocess_run_id(day, dataset)
    # the day's folder (its gate pages) belongs to this DAG: the UI checks access to it by run.json
    write_run_info(run_dir(settings, run_id), RunInfo(dag_id=dataset.dag_id("preprocess_samples"), dag_run_id=dag_run_id,
                                                      dataset=settings.dataset, reason=f"day {day}"))
    result = run_preprocess(settings, day, run_id)
    log.info("day %s: %d rows, %d rejects, snapshot %s (DAG run %s)", day, result.rows, result.rejects, result.snapshot_id,
             dag_run_id)
    snapshot = None if result.snapshot_id is None else int(result.snapshot_id)
    return {"day": str(result.day), "snapshot_id": snapshot, "rows": int(result.rows), "rejects": int(result.rejects),
            "empty": bool(result.empty)}


def gate_day(day: Any, pre: Mapping[str, Any], dataset: DatasetRef,
             params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The quality gate over the day (or the range) just written, at the snapshot that wrote it: a critical
    failure fails the task (QualityGateFailed lists each failed expectation with its value), so
    the `samples` Asset is not emitted and nothing downstream reads the day. Results go to
    `quality_results` under the preprocess run id, the day's profile to `sample_profiles`. The
    bounds are the spec's (or learned), unless this DAG run's params set them (`gate_*`). A day
    without raw events committed nothing: there is nothing to gate, the task is skipped."""
    from airflow.sdk.exceptions import AirflowSkipException

    from slipstream.quality.bounds import GateOverrides
    from slipstream.quality.gate import run_gate
    from slipstream.samples.spec import load_spec

    span = DayRange.of_run(day, params)
    if pre.get("empty") or pre.get("snapshot_id") is None:
        days = f"day {span.first}" if span.first == span.last else f"days {span.first}..{span.last}"
        raise AirflowSkipException(f"{days} had no raw events: nothing committed, nothing to gate")
    settings = dataset.settings()
    # a range is gated as one window (its expectations in one pass, every day's profile in one write)
    window = span.window() if span.first != span.last else None
    result = run_gate(settings, spec=load_spec(settings.spec), day=None if window else span.first, window=window,
                      snapshot_id=int(pre["snapshot_id"]), run_id=span.run_id(dataset),
                      overrides=GateOverrides.from_params(params))
    detail = result.to_dict()
    log.info("%s passed the quality gate at snapshot %s: %d warnings (%s)", result.scope, pre["snapshot_id"],
             len(detail["warnings"]), detail["html"])
    keep = ("run_id", "scope", "snapshot_id", "rows", "passed", "html", "data_docs", "bounds")
    return {k: v for k, v in detail.items() if k in keep}


def warm_recent(run_after: datetime, window_days: int, budget_bytes: int | None, dataset: DatasetRef) -> dict[str, Any]:
    """Warm the window the data set's next daily training will read: the `window_days` days before today."""
    from slipstream.cache.warm import warm_window

    settings = dataset.settings()
    now = run_after.astimezone(UTC)
    end = datetime(now.year, now.month, now.day, tzinfo=UTC)
    report = warm_window(settings, settings.table, window_days, end, None, settings.cache_dir, budget_bytes)
    detail = report.to_dict()
    log.info("warmed [%s, %s): %s", detail.get("window_start"), detail.get("window_end"), detail)
    return {k: v for k, v in detail.items() if isinstance(v, (str, int, float, bool)) or v is None}
