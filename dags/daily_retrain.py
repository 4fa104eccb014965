"""Daily retraining, one DAG per data set: preprocess → quality gate → warmup → train → publish → report.

Scheduled once a day for the previous day (data interval [D, D+1), handoff T = D+1 00:00 UTC)
and triggerable from the UI with params. `preprocess` builds the window's days, pins the snapshot
and writes the run's plan (`<run_dir>/plan.json`: snapshot, window, files, knobs); every later
task reads that plan through its path, the only thing passed on. A re-run (Clear) whose plan
changed trains a new attempt in a run folder of its own; one whose plan did not continues the last
(`slipstream.pipeline.attempts`). Training is launched from ONE job spec: a local torchrun
(`backend=local`), a KubernetesPodOperator (`kubernetes`, one node) or a Kubeflow PyTorchJob
(`kubernetes`, nnodes > 1). The Kubernetes tasks exist only where SLIPSTREAM_TRAINING_BACKEND is
`kubernetes` (importing the provider costs ~2 s of parse time, `slipstream bench dag_parse`), and
there the `backend` param can still pick `local`. The logic lives in `slipstream_airflow.tasks`.

One DAG per data set: `daily_retrain` for the deployment's one spec (SLIPSTREAM_SPEC), or
`daily_retrain__<data set>` per spec file of SLIPSTREAM_SPECS_DIR; each has its own table, topics,
registry and champion (docs/airflow.md, "Several data sets").
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import Asset, CronDataIntervalTimetable, dag, task
from slipstream_airflow import tasks
from slipstream_airflow.callbacks import log_failure
from slipstream_airflow.local_launch import LocalTorchrunOperator
from slipstream_airflow.params import train_params

from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.datasets import DatasetRef, dataset_refs

BACKEND = os.environ.get("SLIPSTREAM_TRAINING_BACKEND") or "local"  # env only: no database or network
BACKENDS = ("local", "kubernetes") if BACKEND == "kubernetes" else ("local",)


def daily_retrain_of(ds: DatasetRef) -> None:
    @dag(
        dag_id=ds.dag_id("daily_retrain"),
        schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
        start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        params=train_params({"backend": BACKEND}, enums={"backend": BACKENDS}),
        # one retry, soon: training resumes from its checkpoint, and a demo failure surfaces fast
        default_args={"retries": 1, "retry_delay": timedelta(seconds=30), "on_failure_callback": log_failure},
        tags=["slipstream", "training", ds.tag],
        doc_md=__doc__,
    )
    def daily_retrain() -> None:
        @task
        def preprocess(params=None, **context):  # type: ignore[no-untyped-def]
            return tasks.preprocess_window(context, params, ds)

        @task(retries=0)  # a failed expectation fails again on retry: stop at once
        def quality_gate(pre):  # type: ignore[no-untyped-def]
            return tasks.quality_gate(pre, ds)

        @task.branch
        def render_job(gate, **context):  # type: ignore[no-untyped-def]
            return tasks.render_job(context, gate, ds)

        @task
        def warmup_local(gate):  # type: ignore[no-untyped-def]
            return tasks.warmup_local(gate, ds)

        @task(trigger_rule="none_failed_min_one_success", outlets=[Asset(ds.asset_uri("models"))])
        def publish(**context):  # type: ignore[no-untyped-def]
            return tasks.publish(context, ds)

        @task
        def report(published, **context):  # type: ignore[no-untyped-def]
            return tasks.report(context, published, ds)

        gate = quality_gate(preprocess())
        choose = render_job(gate)
        warm_local = warmup_local(gate)
        train_local = LocalTorchrunOperator(task_id="train_local")
        choose >> [warm_local, train_local]
        warm_local >> train_local
        published = publish()
        train_local >> published
        if "kubernetes" in BACKENDS:
            from slipstream_airflow.pytorchjob import PyTorchJobOperator
            from slipstream_airflow.training import TrainPodOperator, WarmupPodOperator

            cluster = ClusterSettings.from_env()
            warm_pod = WarmupPodOperator(task_id="warmup_pod", cluster=cluster)
            train_pod = TrainPodOperator(task_id="train_pod", cluster=cluster)
            train_multi = PyTorchJobOperator(task_id="train_pytorchjob", cluster=cluster)
            choose >> [warm_pod, train_pod, train_multi]
            warm_pod >> [train_pod, train_multi]
            [train_pod, train_multi] >> published
        report(published)

    daily_retrain()


for _ds in dataset_refs():
    daily_retrain_of(_ds)
