"""A re-run of a DAG run continues its attempt when the plan is the same, and gets a run folder of its
own when the plan changed; the earlier attempt is never touched."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

from slipstream.lake.planning import WindowFile
from slipstream.pipeline.attempts import place_plan
from slipstream.pipeline.request import TrainRequest
from slipstream.pipeline.runlayout import attempt_dirs, dag_of_run, make_run_id, read_run_info, run_dirs_of_dag_run
from slipstream.pipeline.runplan import read_plan
from slipstream.settings import Settings
from tests.airflow_fixtures import plan_for

DAG, DAG_RUN = "daily_retrain", "manual__2025-01-04T00:00:00+00:00"
BASE = make_run_id("daily", datetime(2025, 1, 4, tzinfo=UTC), DAG_RUN)


def _plan(settings: Settings, snapshot: int, **request: object):  # type: ignore[no-untyped-def]
    return plan_for(settings, TrainRequest(window_days=2, **request), run_id=BASE, snapshot_id=snapshot, write=False)  # type: ignore[arg-type]


def test_same_plan_continues_changed_plan_starts_a_new_attempt(settings: Settings) -> None:
    first = place_plan(settings, _plan(settings, 11), dag_id=DAG, dag_run_id=DAG_RUN)
    assert (first.attempt, first.continued, first.plan.run_id) == (1, False, BASE)
    folder1 = Path(settings.runs_dir) / BASE
    (folder1 / "checkpoint").mkdir()
    (folder1 / "checkpoint" / "latest").write_text("step-000040")  # attempt 1 trained
    written = (folder1 / "plan.json").read_bytes()

    again = place_plan(settings, _plan(settings, 11), dag_id=DAG, dag_run_id=DAG_RUN)  # a Clear of train_local only
    assert (again.attempt, again.continued, again.path) == (1, True, folder1 / "plan.json")
    assert (folder1 / "plan.json").read_bytes() == written

    # preprocess ran again: the day was rewritten, the snapshot is new -> attempt 2, beside attempt 1
    second = place_plan(settings, _plan(settings, 12), dag_id=DAG, dag_run_id=DAG_RUN)
    folder2 = Path(settings.runs_dir) / f"{BASE}-a2"
    assert (second.attempt, second.continued, second.plan.run_id, second.path) == (2, False, f"{BASE}-a2", folder2 / "plan.json")
    assert read_plan(folder2 / "plan.json").snapshot_id == 12 and read_plan(folder2 / "plan.json").run_dir == str(folder2)
    assert (folder1 / "plan.json").read_bytes() == written and (folder1 / "checkpoint" / "latest").exists()
    info = read_run_info(folder2)
    assert info is not None and (info.attempt, info.dag_id, info.dag_run_id, info.dataset) == (2, DAG, DAG_RUN, "synthetic")
    assert info.reason == "the plan changed since attempt 1: snapshot_id"
    # a knob changed (a new conf) is a change too, named as such
    third = place_plan(settings, _plan(settings, 12, lr=0.01), dag_id=DAG, dag_run_id=DAG_RUN)
    assert third.attempt == 3 and third.reason == "the plan changed since attempt 2: request.lr"
    assert [p.name for p in attempt_dirs(settings, BASE)] == [BASE, f"{BASE}-a2", f"{BASE}-a3"]


def test_a_dag_run_s_page_finds_every_attempt_latest_first(settings: Settings) -> None:
    for snapshot in (1, 2, 3):
        place_plan(settings, _plan(settings, snapshot), dag_id=DAG, dag_run_id=DAG_RUN)
    found = run_dirs_of_dag_run(settings, DAG, DAG_RUN)
    assert [p.name for p in found] == [f"{BASE}-a3", f"{BASE}-a2", BASE]
    assert run_dirs_of_dag_run(settings, "preprocess_samples", DAG_RUN) == []  # same run id, another DAG
    assert run_dirs_of_dag_run(settings, DAG, "manual__2025-01-05T00:00:00+00:00") == []
    assert dag_of_run(f"{BASE}-a2", found[1]) == DAG


def test_a_plan_from_before_the_dead_letter_key_still_reads(settings: Settings) -> None:
    plan = plan_for(settings, TrainRequest(window_days=2), run_id=BASE, snapshot_id=7)
    path = Path(plan.run_dir) / "plan.json"
    raw = json.loads(path.read_text())
    del raw["dlq_topic"]
    path.write_text(json.dumps(raw))
    old = read_plan(path)
    assert old.dlq_topic == f"{plan.topic}.dlq" and not old.changes(plan)
    moved = dataclasses.replace(plan, files=(*plan.files, WindowFile("file:///w/x.parquet", 5, 1)))
    assert plan.changes(moved) == ["files"]
