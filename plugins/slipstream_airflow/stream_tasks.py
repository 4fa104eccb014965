"""Work behind `stream_train`: one long-running training that exports a model every K minutes.

The run id is fixed per stream (`stream-<name>`), so when the trainer stops (a crash, a deploy,
a killed task) the next DAG run starts the same run folder and the trainer resumes from its
newest checkpoint — model, optimizer and Kafka offsets.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.jobspec import TrainRequest, build_train_spec
from slipstream.pipeline.runlayout import update_summary, run_dir
from slipstream.settings import Settings
from slipstream_airflow.callbacks import fail_fast
from slipstream_airflow.jobxcom import JOB_XCOM_KEY, RenderedJob, launch_kind


STREAM_PARAMS = ("stream_name", "export_every_min")
"""stream_train's own params besides the training knobs."""


@fail_fast
def render_stream_job(context: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    from slipstream.lake.iceberg import get_catalog, samples_table
    from slipstream.lake.planning import pin_snapshot
    from slipstream.lake.retrain_plan import days_present

    settings, cluster = Settings.from_env(), ClusterSettings.from_env()
    request = TrainRequest.from_params(params, STREAM_PARAMS)
    table = samples_table(get_catalog(settings), settings.namespace)
    snapshot_id = pin_snapshot(table)
    days = days_present(table)
    if not days:
        raise RuntimeError(f"{settings.table} holds no day yet: run preprocess_samples first")
    last = max(days) + timedelta(days=1)
    t_handoff = datetime(last.year, last.month, last.day, tzinfo=timezone.utc)  # after the newest batch day
    run_id = f"stream-{params.get('stream_name', 'main')}"
    spec = build_train_spec(
        settings, cluster, request, run_id=run_id, snapshot_id=snapshot_id, t_handoff=t_handoff,
        extra_overrides={
            "data.stop.mode": "continuous",
            "data.stop.export_every_min": str(params.get("export_every_min", 10)),
            "run.resume": "true",
        },
    )
    spec_overrides = dict(spec.overrides)
    spec_overrides.pop("data.stop.duration_s", None)
    spec_overrides.pop("data.stream", None)
    spec = type(spec).from_dict({**spec.to_dict(), "overrides": spec_overrides})
    job = RenderedJob(spec, launch_kind(request.backend, request.nnodes), request.dry_run, [])
    context["ti"].xcom_push(key=JOB_XCOM_KEY, value=job.to_xcom())
    update_summary(run_dir(settings, run_id), "stream", {"snapshot_id": snapshot_id, "t_handoff": t_handoff.isoformat(), "argv": job.argv})
    return {"run_id": run_id, "snapshot_id": snapshot_id, "t_handoff": t_handoff.isoformat()}
