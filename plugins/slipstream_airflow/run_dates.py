"""Which logical dates the DAGs run.

The DAGs have no `start_date`: Airflow then creates a run's tasks for any logical date, so a
user's 2014 history can be preprocessed, backfilled or retrained on (with a start date, a run dated
before it "succeeds" with no task at all). `catchup=False` keeps a newly enabled DAG from
scheduling every interval since then: only the latest one, and older days on demand
(`airflow dags test`, a trigger with a logical date, `airflow backfill create`).

A date a DAG cannot honour is refused by its first task, naming the date and what to do:
training on a day that is not over yet (its data interval ends in the future).
"""

from __future__ import annotations

from datetime import UTC, datetime

from slipstream.errors import ConfigError


def check_interval_over(start: datetime, end: datetime, now: datetime | None = None) -> None:
    """Refuse (ConfigError) a data interval that has not ended: its day is still being written,
    and the handoff T = its end lies in the future."""
    now = now or datetime.now(UTC)
    if end > now:
        raise ConfigError(
            f"the data interval [{start.isoformat()}, {end.isoformat()}) of this run ends in the future (now "
            f"{now.isoformat(timespec='seconds')}): its day is not over, so it cannot be trained on yet. Trigger the run "
            f"with a logical date whose day has ended (the scheduled run for it starts at {end.isoformat()})")
