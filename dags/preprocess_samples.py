"""Raw logs of day D → the Iceberg table `samples` (day D replaced), once D's clicks are in,
then the quality gate over day D.

Daily and backfillable (`airflow backfill create --dag-id preprocess_samples --from-date ...
--to-date ...`): each run owns its data interval's day, so a backfill rewrites exactly those days
and a second backfill over them changes nothing. The gate (Great Expectations suite over the new
day at the snapshot that wrote it) fails the run on a critical failure; only a day that passed
emits the `samples` Asset, which triggers `cache_warmup`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Asset, CronDataIntervalTimetable, Param, PokeReturnValue, dag, task

from slipstream_airflow import data_tasks
from slipstream_airflow.callbacks import log_failure
from slipstream_airflow.params import GATE_KNOBS, train_params

SAMPLES = Asset("slipstream://samples")


@dag(
    dag_id="preprocess_samples",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=None,  # any logical date runs (slipstream_airflow.run_dates)
    catchup=False,
    max_active_runs=4,
    params={
        "attribution_s": Param(3600, type="integer", minimum=0, maximum=7 * 86_400, title="Attribution window (s)",
                               description="Clicks may arrive this long after their impression; the day is "
                               "processed once its raw files reach this far past midnight."),
        **train_params(only=GATE_KNOBS),
    },
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5), "on_failure_callback": log_failure},
    tags=["slipstream", "data"],
    doc_md=__doc__,
)
def preprocess_samples() -> None:
    @task.sensor(poke_interval=60, timeout=6 * 3600, mode="reschedule")
    def raw_day_ready(params=None, data_interval_start=None) -> PokeReturnValue:  # type: ignore[no-untyped-def]
        return PokeReturnValue(is_done=data_tasks.raw_ready(data_interval_start.date(), int(params["attribution_s"])))

    @task
    def preprocess(data_interval_start=None, run_id=None):  # type: ignore[no-untyped-def]
        return data_tasks.preprocess_day(data_interval_start.date(), run_id)

    @task(outlets=[SAMPLES], retries=0)  # a failed expectation fails again on retry: stop at once
    def quality_gate(pre, params=None, data_interval_start=None):  # type: ignore[no-untyped-def]
        return data_tasks.gate_day(data_interval_start.date(), pre, params)

    pre = preprocess()
    raw_day_ready() >> pre
    quality_gate(pre)


preprocess_samples()
