"""Raw logs of day D → the data set's Iceberg table `samples` (day D replaced), once D's clicks are
in, then the quality gate over day D. One DAG per data set (`preprocess_samples`, or
`preprocess_samples__<data set>` per spec file of SLIPSTREAM_SPECS_DIR).

Daily and backfillable (`airflow backfill create --dag-id preprocess_samples --from-date ...
--to-date ...`): each run owns its data interval's day, so a backfill rewrites exactly those days
and a second backfill over them changes nothing. The gate (Great Expectations suite over the new
day at the snapshot that wrote it) fails the run on a critical failure; only a day that passed
emits the data set's `samples` Asset, which triggers its `cache_warmup`.

A long history goes in one run instead: trigger it with `range_from` and `range_to` (days, both
included), e.g. `airflow dags trigger preprocess_samples --conf '{"range_from": "2025-01-01",
"range_to": "2025-12-31"}'`: one Spark job reads every day of the range and commits it as one
snapshot, and the gate checks the range as one window and stores every day's profile in one write.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Asset, CronDataIntervalTimetable, Param, PokeReturnValue, dag, task

from slipstream.pipeline.datasets import DatasetRef, dataset_refs
from slipstream_airflow import data_tasks
from slipstream_airflow.callbacks import log_failure
from slipstream_airflow.params import GATE_KNOBS, train_params


def preprocess_samples_of(ds: DatasetRef) -> None:
    @dag(
        dag_id=ds.dag_id("preprocess_samples"),
        schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
        start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=4,
        params={
            "attribution_s": Param(3600, type="integer", minimum=0, maximum=7 * 86_400, title="Attribution window",
                                   section="Data window",
                                   description="Clicks may arrive this long after their impression; the day is "
                                   "processed once its raw files reach this far past midnight. A whole number of "
                                   "seconds from 0 to 604800 (7 days). Default: 3600."),
            "range_from": Param(None, type=["null", "string"], format="date", title="Range backfill: first day",
                                section="Data window",
                                description="With range_to: build every day from this one to range_to (both included) "
                                "in one Spark job and one snapshot, instead of the run's own day. A day (YYYY-MM-DD) "
                                "or empty. Default: empty."),
            "range_to": Param(None, type=["null", "string"], format="date", title="Range backfill: last day",
                              section="Data window",
                              description="The range's last day (included). A day (YYYY-MM-DD) or empty. Default: empty."),
            **train_params(only=GATE_KNOBS),
        },
        default_args={"retries": 2, "retry_delay": timedelta(minutes=5), "on_failure_callback": log_failure},
        tags=["slipstream", "data", ds.tag],
        doc_md=__doc__,
    )
    def preprocess_samples() -> None:
        @task.sensor(poke_interval=60, timeout=6 * 3600, mode="reschedule")
        def raw_day_ready(params=None, data_interval_start=None) -> PokeReturnValue:  # type: ignore[no-untyped-def]  # Airflow passes the context by name
            last = data_tasks.DayRange.of_run(data_interval_start.date(), params).last  # a range waits for its last day
            return PokeReturnValue(is_done=data_tasks.raw_ready(last, int(params["attribution_s"]), ds))

        @task
        def preprocess(params=None, data_interval_start=None, run_id=None):  # type: ignore[no-untyped-def]  # Airflow passes the context by name; a dict return annotation would turn on multiple_outputs
            return data_tasks.preprocess_days(data_interval_start.date(), run_id, ds, params)

        @task(outlets=[Asset(ds.asset_uri("samples"))], retries=0)  # a failed expectation fails again on retry
        def quality_gate(pre, params=None, data_interval_start=None):  # type: ignore[no-untyped-def]  # Airflow passes the context by name; a dict return annotation would turn on multiple_outputs
            return data_tasks.gate_day(data_interval_start.date(), pre, ds, params)

        pre = preprocess()
        raw_day_ready() >> pre
        quality_gate(pre)

    preprocess_samples()


for _ds in dataset_refs():
    preprocess_samples_of(_ds)
