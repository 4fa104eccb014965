"""The work behind each DAG task, as plain functions of the Airflow context.

DAG files wrap these in `@task`; every import of another team's module (Spark launch, quality
gate, cache warmup, report) happens inside the function, so parsing a DAG stays light. Each step
records what it decided in the run's `summary.json` and returns only a small XCom (ids, offsets,
paths, counts) — never data.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, is_dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.jobspec import TrainRequest, build_train_spec, warmup_args
from slipstream.pipeline.runlayout import format_summary, make_run_id, read_summary, run_dir, update_summary
from slipstream.settings import Settings
from slipstream_airflow.callbacks import fail_fast
from slipstream_airflow.jobxcom import JOB_XCOM_KEY, LAUNCH_TASKS, TRAIN_TASK_IDS, RenderedJob, launch_kind

log = logging.getLogger(__name__)


def interval(context: Mapping[str, Any]) -> tuple[datetime, datetime]:
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        raise ValueError(
            f"DAG run {context['dag_run'].run_id} has no data interval: trigger it with a logical date "
            "(the daily timetable gives scheduled and manual runs one)"
        )
    # plain UTC datetimes, not pendulum's: arithmetic on those can lose the zone
    return (datetime.fromtimestamp(start.timestamp(), tz=timezone.utc),
            datetime.fromtimestamp(end.timestamp(), tz=timezone.utc))


def run_id_of(context: Mapping[str, Any], kind: str = "daily") -> str:
    """The training run id of this DAG run: the same for every task and every retry."""
    return make_run_id(kind, interval(context)[1], context["dag_run"].run_id)


def small(obj: Any) -> dict[str, Any]:
    """A result object as a JSON-able dict (to_dict(), a dataclass, or a mapping)."""
    if hasattr(obj, "to_dict"):
        return dict(obj.to_dict())
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    return {"result": str(obj)}


def scalars(d: Mapping[str, Any]) -> dict[str, Any]:
    """Only the scalar fields: what may travel by XCom."""
    return {k: v for k, v in d.items() if isinstance(v, (str, int, float, bool)) or v is None}


def _samples_table(settings: Settings) -> Any:
    from slipstream.lake.iceberg import get_catalog, samples_table

    return samples_table(get_catalog(settings), settings.namespace)


@fail_fast
def preprocess_window(context: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Build the interval's day and every missing window day in ONE preprocessing call."""
    from slipstream.pipeline.preprocess_launch import run_preprocess_days
    from slipstream.lake.retrain_plan import plan_days

    settings = Settings.from_env()
    run_id = run_id_of(context)
    from slipstream.lake.planning import pin_snapshot

    start, end = interval(context)
    request = TrainRequest.from_params(params)
    table = _samples_table(settings)
    days = plan_days(table, start, end, request.window_days)
    results = run_preprocess_days(settings, days, run_id)
    if not results:
        raise RuntimeError(f"run_preprocess_days returned nothing for {days}: see the Spark log above")
    per_day = {str(r.day): {"rows": r.rows, "rejects": r.rejects, "seconds": round(r.seconds, 1)} for r in results}
    # Days may commit concurrently, in any order: pin the table's snapshot now that every commit
    # has finished; it holds all of them, and every later task uses this id, never "the latest".
    snapshot_id = pin_snapshot(table.refresh())
    update_summary(run_dir(settings, run_id), "preprocess", {"days": per_day, "snapshot_id": snapshot_id})
    for day, r in per_day.items():
        log.info("preprocessed %s: %d rows, %d rejects in %.1fs", day, r["rows"], r["rejects"], r["seconds"])
    return {"run_id": run_id, "snapshot_id": snapshot_id, "days": list(per_day), "rows": sum(r["rows"] for r in per_day.values())}


@fail_fast
def quality_gate(context: Mapping[str, Any], params: Mapping[str, Any], pre: Mapping[str, Any]) -> dict[str, Any]:
    """Stops the run (QualityGateFailed) when a critical expectation fails on the training window
    (the new day was also gated on its own by preprocess_samples)."""
    from slipstream.lake.planning import window_bounds
    from slipstream.quality.gate import run_gate

    settings = Settings.from_env()
    start, end = interval(context)
    request = TrainRequest.from_params(params)
    result = run_gate(
        settings, day=None, window=window_bounds(end, request.window_days),
        snapshot_id=int(pre["snapshot_id"]), run_id=pre["run_id"],
    )
    detail = small(result)
    update_summary(run_dir(settings, pre["run_id"]), "quality", detail)
    return {"run_id": pre["run_id"], "snapshot_id": int(pre["snapshot_id"]), **scalars(detail)}


@fail_fast
def render_job(context: Mapping[str, Any], params: Mapping[str, Any], gate: Mapping[str, Any]) -> list[str]:
    """Render the ONE job spec of this run (pushed under the `job` key) and pick the launch tasks."""
    settings, cluster = Settings.from_env(), ClusterSettings.from_env()
    request = TrainRequest.from_params(params)
    _, end = interval(context)
    run_id, snapshot_id = gate["run_id"], int(gate["snapshot_id"])
    spec = build_train_spec(settings, cluster, request, run_id=run_id, snapshot_id=snapshot_id, t_handoff=end)
    kind = launch_kind(request.backend, request.nnodes)
    cache_dir = cluster.cache_mount_path if request.backend == "kubernetes" else settings.cache_dir
    job = RenderedJob(spec, kind, request.dry_run, warmup_args(
        table=settings.table, window_days=request.window_days, end=end, snapshot_id=snapshot_id, cache_dir=cache_dir,
    ))
    context["ti"].xcom_push(key=JOB_XCOM_KEY, value=job.to_xcom())
    update_summary(run_dir(settings, run_id), "request", {**request.to_dict(), "launch": kind, "argv": job.argv})
    log.info("run %s: %s launch, world size %d: %s", run_id, kind, spec.world_size, " ".join(job.argv))
    return list(LAUNCH_TASKS[kind])


@fail_fast
def warmup_local(context: Mapping[str, Any], params: Mapping[str, Any], gate: Mapping[str, Any]) -> dict[str, Any]:
    """Copy the window's files at the pinned snapshot to the local cache."""
    from slipstream.cache.warm import warm_window

    settings = Settings.from_env()
    request = TrainRequest.from_params(params)
    report = warm_window(
        settings, settings.table, request.window_days, interval(context)[1],
        int(gate["snapshot_id"]), settings.cache_dir, None,
    )
    detail = small(report)
    update_summary(run_dir(settings, gate["run_id"]), "warmup", detail)
    return {"cache_dir": settings.cache_dir, **scalars(detail)}


def training_result(context: Mapping[str, Any]) -> dict[str, Any]:
    """The lineage XCom of whichever training task ran (the others were skipped by the branch)."""
    ti, dag = context["ti"], context.get("dag")
    for task_id in [t for t in TRAIN_TASK_IDS if dag is None or t in dag.task_ids]:
        value = ti.xcom_pull(task_ids=task_id)
        if value:
            return dict(value)
    raise RuntimeError(f"no training task of {', '.join(TRAIN_TASK_IDS)} returned a result")


def publish(context: Mapping[str, Any]) -> dict[str, Any]:
    """Package the model into the registry; champion/challenger decides promotion."""
    from slipstream.pipeline.registry import ModelRegistry, RegistryConfig

    settings = Settings.from_env()
    lineage = training_result(context)
    if lineage.get("dry_run"):
        return {"run_id": lineage["run_id"], "published": False, "reason": "dry run"}
    # the worker's view of the run folder (a pod reports its own mount path in run_dir)
    path = run_dir(settings, lineage["run_id"])
    if not path.exists() and Path(lineage.get("run_dir", "")).exists():
        path = Path(lineage["run_dir"])
    update_summary(path, "train", lineage)
    config = RegistryConfig.from_env(settings)
    package = ModelRegistry(config.location).publish(path, tolerance=config.tolerance)
    decision = package["decision"]
    update_summary(path, "publish", {"registry": config.location, **decision})
    return {"run_id": package["run_id"], "published": True, **scalars(decision)}


def report(context: Mapping[str, Any], published: Mapping[str, Any]) -> dict[str, Any]:
    """Render the insight report and print the run summary into the task log."""
    from slipstream.quality.report import render_report
    from slipstream_airflow.kafka_connection import with_kafka_connection

    settings = with_kafka_connection(Settings.from_env())  # the audit reads the run's Kafka range
    run_id = published["run_id"]
    path = run_dir(settings, run_id)
    out: dict[str, Any] = {"run_id": run_id, "summary": str(path / "summary.json")}
    if not published.get("dry_run") and published.get("reason") != "dry run":
        report_path = render_report(settings, run_id)
        update_summary(path, "report", {"html": str(report_path)})
        out["report"] = str(report_path)
    log.info("run %s summary:\n%s", run_id, format_summary(read_summary(path)))
    return out


def day_of(context: Mapping[str, Any]) -> date:
    return interval(context)[0].date()
