"""Where a DAG run's plan goes: continue its latest attempt, or start a new one — decided by the plan.

A DAG run that is re-run (Airflow's Clear, a retry of its first task) renders its plan again. When
the new plan equals the plan of the run's latest attempt in everything but the run id and folder
(same snapshot, window, files, topics, knobs), the run **continues** that attempt: its plan.json is
kept as it is, and the trainer resumes its checkpoint (a finished run is not trained again). When
anything differs — typically a new snapshot, because re-running preprocessing rewrote the day —
the run gets a **new attempt**: the next run folder (`<first run id>-a<N>`,
`slipstream.pipeline.runlayout`) with the new plan, and the earlier attempt stays untouched beside it
with its own plan, checkpoint, metrics and report. Nobody has to delete a folder to retrain a day.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

from slipstream.errors import PlanError
from slipstream.pipeline.runlayout import (
    RunInfo,
    attempt_dirs,
    attempt_of,
    attempt_run_id,
    read_run_info,
    run_dir,
    write_run_info,
)
from slipstream.pipeline.runplan import RunPlan, plan_path, read_plan, write_plan
from slipstream.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlacedPlan:
    """The plan a DAG run goes on with, where it is, and how it was decided."""

    plan: RunPlan
    path: Path
    """The plan.json in the attempt's run folder."""
    attempt: int
    continued: bool
    """True: the latest attempt's plan was the same, and that attempt goes on."""
    reason: str


def place_plan(settings: Settings, plan: RunPlan, *, dag_id: str, dag_run_id: str) -> PlacedPlan:
    """Continue the latest attempt of the DAG run whose first attempt is `plan.run_id`, or write
    `plan` as a new attempt (see the module docstring). The plan's run id must be the first attempt's."""
    base = plan.run_id
    if attempt_of(base)[1] != 1:
        raise PlanError(f"place_plan takes the plan with the DAG run's first run id, got attempt id {base}")
    folders = attempt_dirs(settings, base)
    latest = folders[-1] if folders else None
    number = attempt_of(latest.name)[1] if latest is not None else 1
    reason = "first attempt"
    if latest is not None and plan_path(latest).exists():
        try:
            old = read_plan(plan_path(latest))
            changes = old.changes(dataclasses.replace(plan, run_id=old.run_id, run_dir=old.run_dir))
        except PlanError as e:
            changes, old = [f"the plan of attempt {number} is unreadable ({e})"], None
        if not changes and old is not None:
            log.info("run %s: the plan is the one of attempt %d (%s): continuing it", base, number, latest)
            info = read_run_info(latest)
            return PlacedPlan(old, plan_path(latest), number, True, info.reason if info else "first attempt")
        reason = f"the plan changed since attempt {number}: {', '.join(changes)}"
        number += 1
        log.warning("run %s: %s; attempt %d gets a run folder of its own", base, reason, number)
    run_id = attempt_run_id(base, number)
    path = run_dir(settings, run_id)
    placed = dataclasses.replace(plan, run_id=run_id, run_dir=str(path))
    write_run_info(path, RunInfo(dag_id=dag_id, dag_run_id=dag_run_id, dataset=settings.dataset, attempt=number,
                                 reason=reason))
    return PlacedPlan(placed, write_plan(placed, path), number, False, reason)
