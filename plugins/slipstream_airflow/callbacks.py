"""Failure handling: one line that says what failed, why, and where its logs are; configuration
errors fail a task at once instead of being retried."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from slipstream.errors import ConfigError

P = ParamSpec("P")
R = TypeVar("R")

log = logging.getLogger("slipstream.failures")


def log_location(ti: Any) -> str:
    """The task attempt's log file under the log folder (Airflow's default file name template)."""
    base = os.environ.get("AIRFLOW__LOGGING__BASE_LOG_FOLDER") or str(
        Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "logs"
    )
    map_part = f"/map_index={ti.map_index}" if getattr(ti, "map_index", -1) not in (-1, None) else ""
    return f"{base}/dag_id={ti.dag_id}/run_id={ti.run_id}/task_id={ti.task_id}{map_part}/attempt={ti.try_number}.log"


def failure_line(context: Mapping[str, Any]) -> str:
    ti = context["ti"]
    error = context.get("exception")
    reason = f"{type(error).__name__}: {error}" if error is not None else "no exception recorded"
    reason = " ".join(reason.split())[:300]
    url = getattr(ti, "log_url", "")
    return (
        f"FAILED {ti.dag_id}.{ti.task_id} run={ti.run_id} try={ti.try_number}: {reason} | "
        f"log: {log_location(ti)}" + (f" | ui: {url}" if url else "")
    )


def log_failure(context: Mapping[str, Any]) -> None:
    """Task `on_failure_callback`: a one-line summary a person can grep for."""
    try:
        log.error("%s", failure_line(context))
    except Exception:  # a callback must never hide the original failure
        log.exception("could not summarise the failure of %s", context.get("ti"))


def fail_fast(fn: Callable[P, R]) -> Callable[P, R]:
    """A task body whose ConfigError (a bad param, a bad setting) fails the task without retries:
    a retry would fail the same way, only later (Airflow's AirflowFailException skips them)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ConfigError as e:
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(f"configuration error, not retried: {e}") from e

    return wrapper
