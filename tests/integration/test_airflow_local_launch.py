"""The local backend runs the job spec's torchrun command for real, and stops it when killed.

Uses `tests/airflow_standin_trainer.py` (a real 2-process gloo job that writes the run layout)
while `trainers/` is not on this branch; point `trainer_module` at `trainers.train` once merged.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.jobspec import build_train_spec
from slipstream.pipeline.registry import ModelRegistry
from slipstream.pipeline.request import TrainRequest
from slipstream.settings import Settings
from tests.airflow_fixtures import STANDIN_TRAINER, SocketWatch, plan_for

pytestmark = pytest.mark.integration


def local_spec(settings: Settings, run_id: str, **extra: str):  # type: ignore[no-untyped-def]
    cluster = ClusterSettings(trainer_module=STANDIN_TRAINER)
    req = TrainRequest(cpu_processes=2, stream_stop="30", window_days=2)
    return build_train_spec(settings, cluster, plan_for(settings, req, run_id=run_id, snapshot_id=11), extra_overrides=extra)


def test_local_torchrun_trains_and_publishes(settings: Settings, tmp_path: Path) -> None:
    from slipstream_airflow.local_launch import LocalTorchrunOperator

    spec = local_spec(settings, "daily-20250104-local01")
    lineage = LocalTorchrunOperator(task_id="train_local").run_spec(spec)

    run = Path(settings.runs_dir) / spec.run_id
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["world_size"] == 2  # both ranks really ran
    assert json.loads((run / "standin.json").read_text())["rank_sum"] == 3.0
    # the command the trainer received is the spec's, parameters intact
    config = json.loads((run / "config.json").read_text())
    assert config["data.snapshot_id"] == "11" and float(config["data.stop.duration_s"]) == 30  # a typed 30.0 s
    assert config["data.window_days"] == "2" and config["data.cache_dir"] == settings.cache_dir
    # small XCom: ids, offsets and paths, never data
    assert lineage["snapshot_id"] == 11 and lineage["handoff_offsets"] == {"0": 5}
    assert lineage["metrics_path"] == str(run / "metrics.json")
    assert lineage["checkpoint"].startswith(str(run / "checkpoint"))
    assert len(json.dumps(lineage)) < 2000

    package = ModelRegistry(str(tmp_path / "registry")).publish(run)
    assert package["decision"]["promoted"] and package["lineage"]["final_offsets"] == {"0": 15}


def test_failed_trainer_fails_the_task_with_its_run_folder(settings: Settings) -> None:
    from slipstream_airflow.local_launch import LocalTorchrunOperator, TorchrunFailed

    spec = local_spec(settings, "daily-20250104-fail01", **{"standin.fail": "true"})
    with pytest.raises(TorchrunFailed, match=r"exited with \d+ .*daily-20250104-fail01"):
        LocalTorchrunOperator(task_id="train_local").run_spec(spec)


def test_killing_the_task_stops_every_trainer_process(settings: Settings) -> None:
    from slipstream_airflow.local_launch import LocalTorchrunOperator, descendants

    spec = local_spec(settings, "daily-20250104-kill01", **{"standin.sleep_s": "120"})
    op = LocalTorchrunOperator(task_id="train_local", kill_grace_s=10)
    errors: list[BaseException] = []
    worker = threading.Thread(target=lambda: _run(op, spec, errors), daemon=True)
    worker.start()
    deadline = time.monotonic() + 60
    while (op._process is None or op._process.proc is None) and time.monotonic() < deadline:
        time.sleep(0.1)
    root = op._process.proc.pid  # type: ignore[union-attr]
    while len(descendants(root)) < 2 and time.monotonic() < deadline:  # torchrun's 2 workers
        time.sleep(0.2)
    tree = [root, *descendants(root)]
    assert len(tree) >= 3, "torchrun did not start its workers"
    # while the workers wait (after their rendezvous and all_reduce setup), every socket of the
    # training run is on loopback: torchrun's stores and the workers' gloo pairs alike
    with SocketWatch(lambda: [root]) as watch:
        time.sleep(3)
    assert watch.listeners(), "no listener seen: the watch did not look at the training run"
    assert watch.off_loopback() == [], watch.off_loopback()
    started = time.monotonic()
    op.on_kill()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert [p for p in tree if _alive(p)] == [], "trainer processes survived the kill"
    assert time.monotonic() - started < 15
    assert errors and "exited" in str(errors[0])  # the task fails rather than reporting success
    assert not (Path(settings.runs_dir) / spec.run_id / "metrics.json").exists()


def _run(op, spec, errors) -> None:  # type: ignore[no-untyped-def]
    try:
        op.run_spec(spec)
    except BaseException as e:  # noqa: BLE001 - recorded for the assertion
        errors.append(e)


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
