"""Copy the training window's data files to the node-local cache: hourly, and whenever the data
set's `samples` gets a new day (the Asset event of its `preprocess_samples`). One DAG per data set."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable, Param, dag, task

from slipstream.pipeline.datasets import DatasetRef, dataset_refs
from slipstream_airflow import data_tasks
from slipstream_airflow.callbacks import log_failure
from slipstream_airflow.params import train_params


def cache_warmup_of(ds: DatasetRef) -> None:
    @dag(
        dag_id=ds.dag_id("cache_warmup"),
        schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("17 * * * *", timezone="UTC"),
                                     assets=[Asset(ds.asset_uri("samples"))]),
        start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        params={
            **train_params(only=("window_days",), descriptions={
                "window_days": "Days before today whose files are warmed (the next training's window)."}),
            "budget_bytes": Param(None, type=["null", "integer"], minimum=0, title="Cache budget", section="Resources",
                                  description="Most bytes the cache may hold; empty for the cache's own default. "
                                  "A whole number of bytes, at least 0; may be empty. Default: empty."),
        },
        default_args={"retries": 1, "retry_delay": timedelta(minutes=2), "on_failure_callback": log_failure},
        tags=["slipstream", "cache", ds.tag],
        doc_md=__doc__,
    )
    def cache_warmup() -> None:
        @task
        def warm(params=None, dag_run=None):  # type: ignore[no-untyped-def]  # Airflow passes the context by name; a dict return annotation would turn on multiple_outputs
            return data_tasks.warm_recent(dag_run.run_after, int(params["window_days"]), params.get("budget_bytes"), ds)

        warm()

    cache_warmup()


for _ds in dataset_refs():
    cache_warmup_of(_ds)
