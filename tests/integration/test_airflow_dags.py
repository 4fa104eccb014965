"""The DAG files parse with no import errors and nothing heavy imported at parse time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.airflow_fixtures import REPO

pytestmark = pytest.mark.integration

HEAVY = ("torch", "pyspark", "pyiceberg", "pandas", "great_expectations", "confluent_kafka", "pyarrow", "kubernetes")
PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
out = {"dags": {}, "errors": {k: v[-1500:] for k, v in bag.import_errors.items()},
       "heavy": [m for m in sys.argv[2].split(",") if m in sys.modules]}
for dag_id, dag in bag.dags.items():
    out["dags"][dag_id] = {"tasks": sorted(dag.task_ids), "params": sorted(dag.params.keys()), "tags": sorted(dag.tags),
                           "timetable": type(dag.timetable).__name__,
                           "start_date": str(dag.start_date), "catchup": dag.catchup,
                           "edges": sorted([t.task_id, d] for t in dag.tasks for d in t.downstream_task_ids)}
print("PARSED " + json.dumps(out))
"""


def _parse(home: Path, backend: str, **extra: str) -> dict:  # type: ignore[type-arg]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLIPSTREAM_")}, "AIRFLOW_HOME": str(home / "airflow"),
           "SLIPSTREAM_HOME": str(home), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "plugins")]),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "SLIPSTREAM_TRAINING_BACKEND": backend, **extra}
    out = subprocess.run([sys.executable, "-c", PARSE, str(REPO / "dags"), ",".join(HEAVY)],
                         env=env, capture_output=True, text=True, timeout=180)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("PARSED ")), None)
    assert line, f"parsing failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return json.loads(line.removeprefix("PARSED "))


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    """The DAGs as a laptop parses them (SLIPSTREAM_TRAINING_BACKEND=local)."""
    return _parse(tmp_path_factory.mktemp("parse-local"), "local")


@pytest.fixture(scope="module")
def parsed_k8s(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    return _parse(tmp_path_factory.mktemp("parse-k8s"), "kubernetes")


def test_all_dags_parse_without_errors(parsed: dict) -> None:  # type: ignore[type-arg]
    assert parsed["errors"] == {}
    assert set(parsed["dags"]) == {"daily_retrain", "preprocess_samples", "cache_warmup", "stream_train"}


def test_every_dag_runs_any_past_day_without_a_catchup_storm(parsed: dict) -> None:  # type: ignore[type-arg]
    """No start date: a run dated before one would create no task and "succeed" doing nothing."""
    assert {d: (v["start_date"], v["catchup"]) for d, v in parsed["dags"].items()} == {
        d: ("None", False) for d in parsed["dags"]}


def test_no_heavy_import_at_parse_time(parsed: dict) -> None:  # type: ignore[type-arg]
    assert parsed["heavy"] == [], f"DAG parsing imported {parsed['heavy']}: move those imports into the task bodies"


def test_daily_retrain_shape_local(parsed: dict) -> None:  # type: ignore[type-arg]
    dag = parsed["dags"]["daily_retrain"]
    assert dag["timetable"] == "CronDataIntervalTimetable"
    assert set(dag["params"]) >= {"window_days", "epochs", "stream_stop", "gpus", "batch_size", "lr", "replay_share", "backend"}
    edges = {tuple(e) for e in dag["edges"]}
    for edge in [("preprocess", "quality_gate"), ("quality_gate", "render_job"), ("render_job", "warmup_local"),
                 ("warmup_local", "train_local"), ("train_local", "publish"), ("publish", "report")]:
        assert edge in edges, edge
    assert "train_pod" not in dag["tasks"]  # no Kubernetes provider import on a laptop


def test_daily_retrain_shape_kubernetes(parsed_k8s: dict) -> None:  # type: ignore[type-arg]
    assert parsed_k8s["errors"] == {}
    assert "torch" not in parsed_k8s["heavy"] and "pyspark" not in parsed_k8s["heavy"]
    edges = {tuple(e) for e in parsed_k8s["dags"]["daily_retrain"]["edges"]}
    for edge in [("render_job", "warmup_local"), ("render_job", "warmup_pod"), ("render_job", "train_pod"),
                 ("render_job", "train_pytorchjob"), ("warmup_local", "train_local"), ("warmup_pod", "train_pod"),
                 ("warmup_pod", "train_pytorchjob"), ("train_local", "publish"), ("train_pod", "publish"),
                 ("train_pytorchjob", "publish"), ("publish", "report")]:
        assert edge in edges, edge


def test_other_dags(parsed: dict) -> None:  # type: ignore[type-arg]
    assert parsed["dags"]["preprocess_samples"]["timetable"] == "CronDataIntervalTimetable"  # backfillable
    assert parsed["dags"]["preprocess_samples"]["edges"] == [["preprocess", "quality_gate"], ["raw_day_ready", "preprocess"]]
    assert parsed["dags"]["cache_warmup"]["timetable"] == "AssetOrTimeSchedule"
    assert parsed["dags"]["stream_train"]["tasks"] == ["render_job", "train"]


def test_one_set_of_dags_per_spec_file(tmp_path: Path) -> None:
    """SLIPSTREAM_SPECS_DIR: each spec file gets its own four DAGs, tagged with its data set; the
    DAG files still read no spec at parse time."""
    import shutil

    from slipstream.samples.spec import SPECS_DIR

    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("criteo", "ratings"):
        shutil.copy(SPECS_DIR / f"{name}.yaml", specs / f"{name}.yaml")
    parsed = _parse(tmp_path, "local", SLIPSTREAM_SPECS_DIR=str(specs))
    assert parsed["errors"] == {} and parsed["heavy"] == []
    assert set(parsed["dags"]) == {f"{dag}__{ds}" for dag in ("daily_retrain", "preprocess_samples", "cache_warmup",
                                                               "stream_train") for ds in ("criteo", "ratings")}
    assert "dataset:ratings" in parsed["dags"]["daily_retrain__ratings"]["tags"]
    assert parsed["dags"]["daily_retrain__criteo"]["tasks"] == parsed["dags"]["daily_retrain__ratings"]["tasks"]
