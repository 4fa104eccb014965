"""Work behind `stream_train`: one long-running training that exports a model every K minutes.

The run id is fixed per stream (`stream-<name>`), so when the trainer stops (a crash, a deploy,
a killed task) the next DAG run starts the same run folder and the trainer resumes from its
newest checkpoint — model, optimizer and Kafka offsets. It resumes with the plan it started with:
once the run folder holds a checkpoint, its plan.json (snapshot, window, T) is reused as it is,
so a restart after the next daily commit continues the same run instead of being refused for
training on other data.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.datasets import DatasetRef
from slipstream.pipeline.jobspec import build_train_spec, trainer_cache_dir
from slipstream.pipeline.request import TrainRequest
from slipstream.pipeline.runlayout import RunInfo, has_checkpoint, run_dir, update_summary, write_run_info
from slipstream.pipeline.runplan import RunPlan, plan_path, plan_request, read_plan, write_plan
from slipstream.settings import Settings
from slipstream_airflow.callbacks import fail_fast
from slipstream_airflow.jobxcom import JOB_XCOM_KEY, PlanRef, RenderedJob, launch_kind

STREAM_PARAMS = ("stream_name", "export_every_min")
"""stream_train's own params besides the training knobs."""

log = logging.getLogger(__name__)


def new_stream_plan(settings: Settings, cluster: ClusterSettings, run_id: str, request: TrainRequest) -> RunPlan:
    """Pin the current snapshot; T is the end of the newest day the table holds (the stream
    takes over where the batch history ends)."""
    from slipstream.lake.retrain_plan import days_present
    from slipstream.pipeline.datasets import open_dataset_table
    from slipstream.samples.spec import load_spec

    table = open_dataset_table(settings, load_spec(settings.spec))
    days = days_present(table)
    if not days:
        raise RuntimeError(f"{settings.table} holds no day yet: run preprocess_samples first")
    last = max(days) + timedelta(days=1)
    t_handoff = datetime(last.year, last.month, last.day, tzinfo=UTC)
    return plan_request(settings, table, run_id=run_id, request=request, t_handoff=t_handoff,
                        cache_dir=trainer_cache_dir(settings, cluster, request.backend))


def stream_plan(settings: Settings, cluster: ClusterSettings, run_id: str, request: TrainRequest) -> tuple[RunPlan, bool]:
    """(the plan to launch, whether it is the plan of a checkpoint being resumed)."""
    path = run_dir(settings, run_id)
    if has_checkpoint(path) and plan_path(path).exists():
        plan = read_plan(plan_path(path))
        ignored = {k: v for k, v in request.to_dict().items() if plan.request and v != getattr(plan.request, k)}
        log.info("%s resumes its checkpoint with its plan: snapshot %s, T %s%s", run_id, plan.snapshot_id,
                 plan.t_handoff.isoformat(), f"; params that differ from the plan's are ignored: {ignored} "
                 "(a new stream_name starts afresh)" if ignored else "")
        return plan, True
    plan = new_stream_plan(settings, cluster, run_id, request)
    write_plan(plan, path)
    return plan, False


@fail_fast
def render_stream_job(context: Mapping[str, Any], params: Mapping[str, Any], dataset: DatasetRef) -> dict[str, Any]:
    settings, cluster = dataset.settings(), ClusterSettings.from_env()
    run_id = f"{dataset.run_kind('stream')}-{params.get('stream_name', 'main')}"
    request = TrainRequest.from_params(params, STREAM_PARAMS)  # an unknown key fails here, before any data is read
    plan, resumed = stream_plan(settings, cluster, run_id, request)
    write_run_info(run_dir(settings, run_id), RunInfo(dag_id=context["dag"].dag_id, dag_run_id=context["dag_run"].run_id,
                                                      dataset=settings.dataset, reason="stream"))
    assert plan.request is not None, "stream plans are rendered with their request"
    spec = build_train_spec(
        settings, cluster, plan,
        extra_overrides={
            "data.stop.mode": "continuous",
            "data.stop.export_every_min": str(params.get("export_every_min", 10)),
            "run.resume": "true",
        },
    )
    job = RenderedJob(spec, launch_kind(plan.request.backend, plan.request.node_range[1]), plan.request.dry_run, [])
    context["ti"].xcom_push(key=JOB_XCOM_KEY, value=job.to_xcom())
    update_summary(run_dir(settings, run_id), "stream", {"snapshot_id": plan.snapshot_id, "t_handoff": plan.t_handoff.isoformat(),
                                                         "resumed_plan": resumed, "argv": job.argv})
    return {**PlanRef(str(plan_path(run_dir(settings, run_id)))).to_xcom(), "snapshot_id": plan.snapshot_id,
            "t_handoff": plan.t_handoff.isoformat()}
