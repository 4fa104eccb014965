"""Daily retraining: preprocess → quality gate → warmup → train → publish → report.

Scheduled once a day for the previous day (data interval [D, D+1), handoff T = D+1 00:00 UTC)
and triggerable from the UI with params. Training is launched from ONE job spec: a local torchrun
(`backend=local`), a KubernetesPodOperator (`kubernetes`, one node) or a Kubeflow PyTorchJob
(`kubernetes`, nnodes > 1). The logic lives in `slipstream_airflow.tasks`.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import Asset, CronDataIntervalTimetable, dag, task

from slipstream.cluster import ClusterSettings
from slipstream_airflow import tasks
from slipstream_airflow.callbacks import log_failure
from slipstream_airflow.local_launch import LocalTorchrunOperator
from slipstream_airflow.params import train_params
from slipstream_airflow.pytorchjob import PyTorchJobOperator
from slipstream_airflow.training import TrainPodOperator, WarmupPodOperator

CLUSTER = ClusterSettings.from_env()  # env only: no database or network at parse time
BACKEND = os.environ.get("SLIPSTREAM_TRAINING_BACKEND") or "local"
MODELS = Asset("slipstream://models")


@dag(
    dag_id="daily_retrain",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params=train_params({"backend": BACKEND}),
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2), "on_failure_callback": log_failure},
    tags=["slipstream", "training"],
    doc_md=__doc__,
)
def daily_retrain() -> None:
    @task
    def preprocess(params=None, **context):  # type: ignore[no-untyped-def]
        return tasks.preprocess_window(context, params)

    @task(retries=0)  # a failed expectation fails again on retry: stop at once
    def quality_gate(pre, params=None, **context):  # type: ignore[no-untyped-def]
        return tasks.quality_gate(context, params, pre)

    @task.branch
    def render_job(gate, params=None, **context):  # type: ignore[no-untyped-def]
        return tasks.render_job(context, params, gate)

    @task
    def warmup_local(gate, params=None, **context):  # type: ignore[no-untyped-def]
        return tasks.warmup_local(context, params, gate)

    @task(trigger_rule="none_failed_min_one_success", outlets=[MODELS])
    def publish(**context):  # type: ignore[no-untyped-def]
        return tasks.publish(context)

    @task
    def report(published, **context):  # type: ignore[no-untyped-def]
        return tasks.report(context, published)

    gate = quality_gate(preprocess())
    choose = render_job(gate)
    warm_local = warmup_local(gate)
    warm_pod = WarmupPodOperator(task_id="warmup_pod", cluster=CLUSTER)
    train_local = LocalTorchrunOperator(task_id="train_local")
    train_pod = TrainPodOperator(task_id="train_pod", cluster=CLUSTER)
    train_multi = PyTorchJobOperator(task_id="train_pytorchjob", cluster=CLUSTER)
    choose >> [warm_local, warm_pod, train_local, train_pod, train_multi]
    warm_local >> train_local
    warm_pod >> [train_pod, train_multi]
    published = publish()
    [train_local, train_pod, train_multi] >> published
    report(published)


daily_retrain()
