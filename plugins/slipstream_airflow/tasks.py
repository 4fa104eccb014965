"""The work behind each task of `daily_retrain`, as plain functions of the Airflow context.

DAG files wrap these in `@task`, one set of DAGs per data set (`slipstream.pipeline.datasets`):
each function takes the data set's `DatasetRef` and works with its settings (table, topics, raw
zone, registry). Every import of another team's module (Spark launch, quality gate, cache warmup,
report) happens inside the function, so parsing a DAG stays light. The first step writes the
run's plan.json — into the DAG run's latest attempt when the plan is unchanged, else into a new
attempt (`slipstream.pipeline.attempts`) — and hands on its path (`PlanRef`); later steps read the
plan and never recompute the interval, the request, the window or the files. Each step records
what it decided in the attempt's `summary.json` and returns only a small XCom (ids, offsets,
paths, counts) — never data.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.datasets import DatasetRef
from slipstream.pipeline.jobspec import build_train_spec, trainer_cache_dir, warmup_args
from slipstream.pipeline.request import TrainRequest
from slipstream.pipeline.runlayout import format_summary, make_run_id, read_summary, run_dir, update_summary
from slipstream.settings import Settings
from slipstream_airflow.callbacks import fail_fast
from slipstream_airflow.jobxcom import JOB_XCOM_KEY, LAUNCH_TASKS, TRAIN_TASK_IDS, PlanRef, RenderedJob, launch_kind

log = logging.getLogger(__name__)


def interval(context: Mapping[str, Any]) -> tuple[datetime, datetime]:
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        raise ValueError(
            f"DAG run {context['dag_run'].run_id} has no data interval: trigger it with a logical date "
            "(the daily timetable gives scheduled and manual runs one)"
        )
    # plain UTC datetimes, not pendulum's: arithmetic on those can lose the zone
    return (datetime.fromtimestamp(start.timestamp(), tz=UTC),
            datetime.fromtimestamp(end.timestamp(), tz=UTC))


def run_id_of(context: Mapping[str, Any], dataset: DatasetRef, kind: str = "daily") -> str:
    """The run id of this DAG run's first attempt: the same for every task and every retry."""
    return make_run_id(dataset.run_kind(kind), interval(context)[1], context["dag_run"].run_id)


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


def dataset_table(settings: Settings) -> tuple[Any, Any]:
    """(the data set's spec, its samples table) once both its raw zone and its table are checked to
    be the data set's (a DatasetMismatch otherwise, named in the error's first line)."""
    from slipstream.pipeline.datasets import check_raw_zone, open_dataset_table
    from slipstream.samples.spec import load_spec

    spec = load_spec(settings.spec)
    check_raw_zone(settings, spec)
    return spec, open_dataset_table(settings, spec)


@fail_fast
def preprocess_window(context: Mapping[str, Any], params: Mapping[str, Any], dataset: DatasetRef) -> dict[str, str]:
    """Build the interval's day and every missing window day in ONE preprocessing call, pin the
    snapshot that holds them and render the run's plan: the one place this DAG run's window,
    snapshot and files are worked out. The plan goes to the run's latest attempt when it is the
    same, else to a new attempt (`place_plan`). Returns the plan's path (`PlanRef`)."""
    from slipstream.lake.retrain_plan import plan_days
    from slipstream.pipeline.attempts import place_plan
    from slipstream.pipeline.preprocess_launch import run_preprocess_days
    from slipstream.pipeline.runplan import plan_request
    from slipstream_airflow.run_dates import check_interval_over

    settings, cluster = dataset.settings(), ClusterSettings.from_env()
    run_id = run_id_of(context, dataset)
    start, end = interval(context)
    check_interval_over(start, end)
    request = TrainRequest.from_params(params)
    spec, table = dataset_table(settings)
    days = plan_days(table, start, end, request.window_days)
    results = run_preprocess_days(settings, days, run_id)
    if not results:
        raise RuntimeError(f"run_preprocess_days returned nothing for {days}: see the Spark log above")
    per_day = {str(r.day): {"rows": r.rows, "rejects": r.rejects, "seconds": round(r.seconds, 1)} for r in results}
    for day, r in per_day.items():
        log.info("preprocessed %s: %d rows, %d rejects in %.1fs", day, r["rows"], r["rejects"], r["seconds"])
    # Days may commit concurrently, in any order: pin the table's snapshot now that every commit
    # has finished; it holds all of them, and every later task reads the plan, never "the latest".
    empty = table.refresh().current_snapshot() is None
    fresh = None if empty else plan_request(settings, table, run_id=run_id, request=request, t_handoff=end,
                                            cache_dir=trainer_cache_dir(settings, cluster, request.backend), spec=spec)
    if fresh is None or not fresh.files:
        from slipstream.errors import RawDataError

        raise RawDataError(
            f"data set {settings.dataset} (spec {settings.spec}) has no samples in the window ending {end.date()}: "
            f"its raw zone {settings.raw_dir} holds no file of {', '.join(str(d) for d in days)} and {settings.table} "
            "no row of the window; land the raw files there, or point SLIPSTREAM_SPEC / the data set's RAW_DIR at the "
            "data you meant (docs/datasets.md)")
    placed = place_plan(settings, fresh, dag_id=context["dag"].dag_id, dag_run_id=context["dag_run"].run_id)
    plan, path = placed.plan, run_dir(settings, placed.plan.run_id)
    if placed.continued:  # the same plan: the attempt goes on; its files stay as they are
        log.info("run %s continues attempt %d (%s): nothing in its plan changed", plan.run_id, placed.attempt, path)
        return PlanRef(str(placed.path)).to_xcom()
    update_summary(path, "attempt", {"attempt": placed.attempt, "reason": placed.reason, "dataset": settings.dataset,
                                     "dag_run_id": context["dag_run"].run_id})
    update_summary(path, "preprocess", {"days": per_day, "snapshot_id": plan.snapshot_id})
    ref = PlanRef(str(placed.path))
    update_summary(path, "plan", {"path": ref.path, "snapshot_id": plan.snapshot_id,
                                  "window_start": plan.window_start.isoformat(), "t_handoff": plan.t_handoff.isoformat(),
                                  "files": len(plan.files), "rows": plan.rows})
    return ref.to_xcom()


def quality_gate(pre: Mapping[str, Any], dataset: DatasetRef) -> dict[str, Any]:
    """Stops the run (QualityGateFailed) when a critical expectation fails on the plan's window and
    files (the new day was also gated on its own by preprocess_samples), with the plan's spec and
    the bounds its request (the DAG params `gate_*`) sets. Hands the plan on."""
    from slipstream.quality.bounds import GateOverrides
    from slipstream.quality.gate import run_gate

    settings = dataset.settings()
    ref = PlanRef.from_xcom(pre, task_id="preprocess")
    plan = ref.load()
    result = run_gate(settings, spec=plan.spec, day=None, window=plan.window, snapshot_id=plan.snapshot_id,
                      run_id=plan.run_id, overrides=GateOverrides.from_params(plan.request), files=plan.files)
    detail = small(result)
    update_summary(run_dir(settings, plan.run_id), "quality", detail)
    return {**scalars(detail), **ref.to_xcom()}


@fail_fast
def render_job(context: Mapping[str, Any], gate: Mapping[str, Any], dataset: DatasetRef) -> list[str]:
    """Render the ONE job spec of the planned run (pushed under the `job` key) and pick the launch
    tasks. On a dry run the launch task renders what it would start — the exact pod, PyTorchJob or
    local command — into its log and XCom instead (`slipstream_airflow.dryrun`)."""
    settings, cluster = dataset.settings(), ClusterSettings.from_env()
    plan = PlanRef.from_xcom(gate, task_id="quality_gate").load()
    request = plan.request
    if request is None:
        raise ValueError(f"the plan of run {plan.run_id} carries no request: it was not rendered by this DAG")
    spec = build_train_spec(settings, cluster, plan)
    kind = launch_kind(request.backend, request.node_range[1])
    job = RenderedJob(spec, kind, request.dry_run, warmup_args(spec.plan_path))
    context["ti"].xcom_push(key=JOB_XCOM_KEY, value=job.to_xcom())
    update_summary(run_dir(settings, plan.run_id), "request", {**request.to_dict(), "launch": kind, "argv": job.argv})
    log.info("run %s: %s launch, world size %d: %s", plan.run_id, kind, spec.world_size, " ".join(job.argv))
    return list(LAUNCH_TASKS[kind])


def warmup_local(gate: Mapping[str, Any], dataset: DatasetRef) -> dict[str, Any]:
    """Copy the plan's files (at its snapshot) to the local cache."""
    from slipstream.cache.warm import warm_plan

    settings = dataset.settings()
    plan = PlanRef.from_xcom(gate, task_id="quality_gate").load()
    report = warm_plan(settings, plan)
    detail = small(report)
    update_summary(run_dir(settings, plan.run_id), "warmup", detail)
    return {"cache_dir": plan.cache_dir, **scalars(detail)}


def training_result(context: Mapping[str, Any]) -> dict[str, Any]:
    """The lineage XCom of whichever training task ran (the others were skipped by the branch)."""
    ti, dag = context["ti"], context.get("dag")
    for task_id in [t for t in TRAIN_TASK_IDS if dag is None or t in dag.task_ids]:
        value = ti.xcom_pull(task_ids=task_id)
        if value:
            return dict(value)
    raise RuntimeError(f"no training task of {', '.join(TRAIN_TASK_IDS)} returned a result")


def publish(context: Mapping[str, Any], dataset: DatasetRef) -> dict[str, Any]:
    """Package the model into the data set's registry; champion/challenger (of this data set only)
    decides promotion."""
    from slipstream.pipeline.registry import ModelRegistry, RegistryConfig

    settings = dataset.settings()
    lineage = training_result(context)
    if lineage.get("dry_run"):
        return {"run_id": lineage["run_id"], "published": False, "reason": "dry run"}
    # the worker's view of the run folder (a pod reports its own mount path in run_dir)
    path = run_dir(settings, lineage["run_id"])
    if not path.exists() and Path(lineage.get("run_dir", "")).exists():
        path = Path(lineage["run_dir"])
    update_summary(path, "train", lineage)
    config = RegistryConfig.from_env(settings)
    package = ModelRegistry(config.location).publish(path, tolerance=config.tolerance, rule=config.rule)
    decision = package["decision"]
    update_summary(path, "publish", {"registry": config.location, "dataset": settings.dataset, **decision})
    return {"run_id": package["run_id"], "published": True, **scalars(decision)}


def report(context: Mapping[str, Any], published: Mapping[str, Any], dataset: DatasetRef) -> dict[str, Any]:
    """Render the insight report and print the run summary into the task log."""
    from slipstream.quality.report import render_report
    from slipstream_airflow.kafka_connection import with_kafka_connection

    settings = with_kafka_connection(dataset.settings())  # the audit reads the run's Kafka range
    run_id = published["run_id"]
    path = run_dir(settings, run_id)
    out: dict[str, Any] = {"run_id": run_id, "summary": str(path / "summary.json")}
    if not published.get("dry_run") and published.get("reason") != "dry run":
        report_path = render_report(settings, run_id)
        update_summary(path, "report", {"html": str(report_path)})
        out["report"] = str(report_path)
    log.info("run %s summary:\n%s", run_id, format_summary(read_summary(path)))
    return out

