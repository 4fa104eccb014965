"""Continuous training, one DAG per data set: one long-running trainer tails Kafka and exports a
model every K minutes.

`@continuous` with one active run: if the trainer stops, the next run starts the same run folder
(`stream-<name>`, `stream-<data set>-<name>` where a deployment has several data sets) and the
trainer resumes from its newest checkpoint (model, optimizer, offsets) with the plan it started
with (`plan.json`: snapshot, window, T), also after new days landed.

Depends on a producer of samples on the data set's sample topic: in production the sample joiner
(`slipstream joiner run`, docs/joiner.md; the compose service `joiner`, a StatefulSet on
Kubernetes), which this DAG does not start. Without it the trainer waits at the topic's end.
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import BaseOperator, Param, dag, task

from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.datasets import DatasetRef, dataset_refs
from slipstream_airflow import stream_tasks
from slipstream_airflow.callbacks import log_failure
from slipstream_airflow.local_launch import LocalTorchrunOperator
from slipstream_airflow.params import train_params

BACKEND = os.environ.get("SLIPSTREAM_TRAINING_BACKEND") or "local"


def stream_params() -> dict[str, Param]:
    params = train_params({"backend": BACKEND}, enums={"backend": (BACKEND,)},
                          only=("window_days", "gpus", "cpu_processes", "batch_size", "lr", "replay_share", "backend"))
    params["stream_name"] = Param("main", type="string", pattern="^[a-z0-9-]{1,40}$", title="Stream name", section="Run",
                                  description="Names the run folder stream-<name>; the same name resumes the same "
                                  "training. 1 to 40 lower-case letters, digits or '-'. Default: main.")
    params["export_every_min"] = Param(10, type="number", exclusiveMinimum=0, maximum=1440, title="Export every",
                                       section="Run", description="Minutes between model exports (and checkpoints). "
                                       "A number of minutes greater than 0, at most 1440. Default: 10.")
    return params


def stream_train_of(ds: DatasetRef) -> None:
    @dag(
        dag_id=ds.dag_id("stream_train"),
        schedule="@continuous",
        start_date=None,  # any logical date runs (slipstream_airflow.run_dates)
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=True,
        params=stream_params(),
        default_args={"retries": 3, "retry_delay": timedelta(minutes=1), "on_failure_callback": log_failure},
        tags=["slipstream", "training", "stream", ds.tag],
        doc_md=__doc__,
    )
    def stream_train() -> None:
        @task
        def render_job(params=None, **context):  # type: ignore[no-untyped-def]
            return stream_tasks.render_stream_job(context, params, ds)

        train: BaseOperator
        if BACKEND == "kubernetes":
            from slipstream_airflow.training import TrainPodOperator  # the provider import costs ~2 s

            train = TrainPodOperator(task_id="train", cluster=ClusterSettings.from_env())
        else:
            train = LocalTorchrunOperator(task_id="train")
        render_job() >> train

    stream_train()


for _ds in dataset_refs():
    stream_train_of(_ds)
