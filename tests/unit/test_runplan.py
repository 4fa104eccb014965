"""The run plan: built once from a real table, written and read back, every bad key named, and
refused by the trainer when it contradicts its snapshot or a `--set`."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from slipstream.errors import ConfigError, PlanError
from slipstream.lake.planning import WindowFile, plan_window_files
from slipstream.pipeline.cluster import ClusterSettings
from slipstream.pipeline.request import TrainRequest
from slipstream.pipeline.runplan import (
    PLAN_FILE,
    RunPlan,
    build_run_plan,
    check_plan_files,
    plan_request,
    read_plan,
    write_plan,
)
from slipstream.settings import Settings
from tests.trainer_fixtures import SamplesFixture, make_samples


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> SamplesFixture:
    return make_samples(tmp_path_factory.mktemp("plan-home"), days=3, per_day=400, row_group_rows=200)


def _plan(fx: SamplesFixture, run_id: str = "daily-20261104-0000abcd", window_days: int = 2, **knobs: object) -> RunPlan:
    request = TrainRequest(window_days=window_days, **knobs)  # type: ignore[arg-type]
    return plan_request(fx.settings, fx.table, run_id=run_id, request=request, t_handoff=fx.t_handoff,
                        cache_dir=fx.settings.cache_dir, snapshot_id=fx.snapshot_id)


def test_the_plan_holds_the_window_and_its_files_once(fx: SamplesFixture) -> None:
    plan = _plan(fx)
    t = fx.t_handoff
    assert plan.t_handoff == t and plan.window_start == t - timedelta(days=2)
    assert plan.window_start.tzinfo == UTC and plan.window_days == 2
    assert plan.files == plan_window_files(fx.table, fx.snapshot_id, t - timedelta(days=2), t).files
    assert plan.rows == 2 * 400 and len(plan.files) >= 2
    assert plan.topic == fx.settings.topic and plan.bootstrap == fx.settings.kafka_bootstrap
    assert Path(plan.run_dir) == Path(fx.settings.runs_dir) / plan.run_id
    # a pendulum-like end with another zone is still the same instant, stored as UTC
    other_zone = t.astimezone(timezone(timedelta(hours=5)))
    assert _plan(fx).t_handoff == build_run_plan(
        fx.table, run_id="x", run_dir="/r/x", t_handoff=other_zone, window_days=2, snapshot_id=None, topic="t",
        bootstrap="b", cache_dir="").t_handoff


def test_plan_json_round_trips_atomically(fx: SamplesFixture) -> None:
    plan = _plan(fx, epochs=3, stream_stop="60", exchange=True)
    path = write_plan(plan)
    assert path == Path(plan.run_dir) / PLAN_FILE
    assert [p.name for p in path.parent.iterdir()] == [PLAN_FILE]  # no temporary file left behind
    raw = json.loads(path.read_text())
    assert raw["plan_version"] == 1 and raw["snapshot_id"] == fx.snapshot_id and raw["file_count"] == len(plan.files)
    assert raw["t_handoff"] == fx.t_handoff.isoformat() and raw["request"]["epochs"] == 3
    back = read_plan(path)
    assert back == plan and back.t_handoff == fx.t_handoff and back.request == plan.request


@pytest.mark.parametrize("change, named", [
    ({"snapshot_id": "123"}, "'snapshot_id' must be an integer"),
    ({"t_handoff": "2026-11-04T00:00:00"}, "'t_handoff' must be timezone-aware"),
    ({"t_handoff": "tomorrow"}, "'t_handoff' must be an ISO-8601 time"),
    ({"plan_version": 2}, "plan_version 2"),
    ({"surprise": 1}, "unknown key(s) surprise"),
    ({"topic": None}, "'topic' must be a string"),
    ({"files": [{"path": "f", "size_bytes": -1, "record_count": 1, "delete_files": []}]}, "'files[0].size_bytes'"),
    ({"request": {"batch_size": 3}}, "'request': batch_size must be >= 8"),
    ({"run_id": "../etc"}, "'run_id' must name a run folder"),
])
def test_a_bad_plan_is_refused_naming_the_key(fx: SamplesFixture, tmp_path: Path, change: dict[str, object], named: str) -> None:
    raw = {**_plan(fx).to_dict(), **change}
    path = tmp_path / PLAN_FILE
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanError) as err:
        read_plan(path)
    assert named in str(err.value) and str(path) in str(err.value)


def test_missing_keys_and_files_are_named(fx: SamplesFixture, tmp_path: Path) -> None:
    raw = _plan(fx).to_dict()
    del raw["cache_dir"]
    (tmp_path / PLAN_FILE).write_text(json.dumps(raw))
    with pytest.raises(PlanError, match="lacks key.s. cache_dir"):
        read_plan(tmp_path / PLAN_FILE)
    with pytest.raises(PlanError, match="no plan at .*render step"):
        read_plan(tmp_path / "nowhere" / PLAN_FILE)


def test_a_plan_whose_files_differ_from_its_snapshot_is_refused(fx: SamplesFixture) -> None:
    plan = _plan(fx)
    check_plan_files(fx.table, plan)  # the plan as built: accepted
    dropped = dataclasses.replace(plan, files=plan.files[1:])
    with pytest.raises(PlanError, match="only in the snapshot"):
        check_plan_files(fx.table, dropped)
    f = plan.files[0]
    edited = dataclasses.replace(plan, files=(WindowFile(f.path, f.size_bytes, f.record_count + 1), *plan.files[1:]))
    with pytest.raises(PlanError, match="different size or row count"):
        check_plan_files(fx.table, edited)
    foreign = dataclasses.replace(plan, files=(*plan.files, WindowFile("file:///elsewhere/x.parquet", 10, 1)))
    with pytest.raises(PlanError, match="only in the plan: file:///elsewhere/x.parquet"):
        check_plan_files(fx.table, foreign)


def test_request_and_window_must_agree() -> None:
    t = datetime(2026, 11, 4, tzinfo=UTC)
    with pytest.raises(PlanError, match="window spans 1 days but its request says window_days=2"):
        RunPlan(run_id="r", table="ns.samples", snapshot_id=1, window_start=t - timedelta(days=1), t_handoff=t, topic="s",
                bootstrap="b", max_lateness_s=120, cache_dir="", run_dir="/runs/r", files=(), request=TrainRequest(window_days=2))


def test_the_trainer_config_comes_from_the_plan_and_set_changes_only_knobs(fx: SamplesFixture) -> None:
    from trainers.config.plan import load_plan_config

    plan = _plan(fx, "daily-20261104-cfg00001", epochs=2, batch_size=512, stream_stop="0", lr=0.01)
    path = write_plan(plan)
    got, cfg = load_plan_config(path, None, ["data.batch_size=64"], fx.settings)
    assert got == plan
    assert cfg.data.snapshot_id == fx.snapshot_id and cfg.data.t_handoff == fx.t_handoff  # a datetime, from the plan
    assert cfg.data.window_start == plan.window_start and cfg.run.run_dir == path.parent
    assert cfg.data.epochs == 2 and cfg.optim.lr == 0.01 and cfg.data.stream is False
    assert cfg.data.batch_size == 64  # an experiment's --set wins over the plan's knob
    with pytest.raises(ConfigError, match="--set data.snapshot_id=7 contradicts the plan"):
        load_plan_config(path, None, ["data.snapshot_id=7"], fx.settings)
    with pytest.raises(ConfigError, match="data.t_handoff"):
        load_plan_config(path, None, ["data.t_handoff=2030-01-01T00:00:00+00:00"], fx.settings)
    moved = path.parent.parent / "elsewhere" / PLAN_FILE
    moved.parent.mkdir()
    moved.write_text(path.read_text())
    with pytest.raises(PlanError, match="a plan lives in its run folder"):
        load_plan_config(moved, None, [], fx.settings)


def test_a_pod_reads_the_plan_from_the_runs_volume(fx: SamplesFixture) -> None:
    from slipstream.pipeline.jobspec import build_train_spec

    plan = _plan(fx, backend="kubernetes")
    spec = build_train_spec(fx.settings, ClusterSettings(runs_volume="pvc:runs"), plan)
    assert spec.plan_path == f"/runs/{plan.run_id}/{PLAN_FILE}" and "--plan" in spec.torchrun_args()
    with pytest.raises(ConfigError, match="SLIPSTREAM_RUNS_VOLUME"):
        build_train_spec(fx.settings, ClusterSettings(), plan)
    local = _plan(fx)
    assert build_train_spec(fx.settings, ClusterSettings(), local).plan_path == str(Path(local.run_dir) / PLAN_FILE)


def test_the_window_is_computed_by_one_function(fx: SamplesFixture) -> None:
    """The trainer's config, the retrain planner and the plan agree on [T - W, T)."""
    from slipstream.lake.retrain_plan import window_days
    from trainers.config.schema import DataConfig

    plan = _plan(fx, window_days=3)
    cfg = DataConfig(snapshot_id=plan.snapshot_id, t_handoff=plan.t_handoff.isoformat(), window_days=3)
    assert cfg.window_start == plan.window_start
    days = window_days(plan.t_handoff, 3)
    assert days[0] == plan.window_start.date() and len(days) == 3


def test_settings_are_not_read_by_the_plan(tmp_path: Path) -> None:
    """A plan read on another machine (a pod) keeps the render step's facts, whatever its env says."""
    t = datetime(2026, 11, 4, tzinfo=UTC)
    plan = RunPlan(run_id="r1", table="ns.samples", snapshot_id=5, window_start=t - timedelta(days=1), t_handoff=t,
                   topic="events", bootstrap="kafka:9092", max_lateness_s=30, cache_dir="/cache", run_dir="/runs/r1",
                   files=(WindowFile("s3://w/a.parquet", 10, 2, ("s3://w/d.parquet",)),))
    path = write_plan(plan, tmp_path / "r1")
    back = read_plan(path)
    assert back == plan and back.request is None and back.files[0].delete_files == ("s3://w/d.parquet",)
    assert Settings(home=tmp_path).topic != back.topic


def test_cache_warm_plan_copies_exactly_the_plan_files(fx: SamplesFixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`slipstream cache warm --plan` (what the warmup pod runs) copies the plan's data files into its cache dir."""
    from slipstream.cli import main

    monkeypatch.setenv("SLIPSTREAM_HOME", str(fx.settings.home))
    plan = dataclasses.replace(_plan(fx, "daily-20261104-warmcli1"), cache_dir=str(tmp_path / "cache"))
    path = write_plan(plan)
    assert main(["cache", "warm", "--plan", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["snapshot_id"] == fx.snapshot_id and report["cache_dir"] == str(tmp_path / "cache")
    assert report["expected_hit_ratio"] == 1.0 and report["window_start"] == plan.window_start.isoformat()
    assert main(["cache", "warm", "--plan", str(path), "--window-days", "3"]) == 2  # the plan fixes the window
