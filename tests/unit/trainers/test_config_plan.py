"""The trainer reads exactly its plan's files — the ones the warmup copied — and refuses a plan
that does not match its snapshot; its config.json records the plan's snapshot and T."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from slipstream.errors import PlanError
from slipstream.pipeline.request import TrainRequest
from slipstream.pipeline.runplan import plan_request, write_plan
from tests.trainer_fixtures import SamplesFixture, make_samples, training_ids

SMALL = ("model.buckets.user_id=2003", "model.buckets.item_id=1009", "model.buckets.device_hash=101",
         "model.buckets.country_hash=101", "model.buckets.category_hash=101", "model.embed_dim=8", "model.bottom_mlp=[16]",
         "model.top_mlp=[16]", "run.tensorboard=false", "data.shuffle_buffer=600")


@pytest.fixture
def fx(tmp_path: Path) -> SamplesFixture:
    return make_samples(tmp_path, days=2, per_day=600, row_group_rows=200)


def _planned(fx: SamplesFixture, run_id: str) -> Path:
    request = TrainRequest(window_days=2, epochs=1, stream_stop="0", batch_size=64)
    plan = plan_request(fx.settings, fx.table, run_id=run_id, request=request, t_handoff=fx.t_handoff,
                        cache_dir=fx.settings.cache_dir, snapshot_id=fx.snapshot_id)
    return write_plan(plan)


def test_the_trainer_reads_what_the_warmup_copied(fx: SamplesFixture) -> None:
    from slipstream.cache.warm import warm_plan
    from trainers.config.plan import load_plan_config
    from trainers.train import run

    path = _planned(fx, "daily-20261103-warm0001")
    plan, cfg = load_plan_config(path, None, SMALL, fx.settings)
    warmed = warm_plan(fx.settings, plan)
    assert warmed.expected_hit_ratio == 1.0 and warmed.planned_files >= len(plan.files)

    summary = run(cfg, fx.settings, plan=plan, plan_file=path)
    assert summary["cache"]["hit_ratio"] == 1.0 and summary["cache"]["misses"] == 0
    assert summary["cache"]["hits"] >= len(plan.files)
    assert summary["samples_iceberg"] == len(training_ids(fx))
    assert summary["snapshot_id"] == plan.snapshot_id and summary["t_handoff"] == plan.t_handoff.isoformat()
    config = json.loads((path.parent / "config.json").read_text())
    assert config["plan"]["snapshot_id"] == fx.snapshot_id and config["plan"]["path"] == str(path)
    assert config["data"]["snapshot_id"] == fx.snapshot_id and config["data"]["t_handoff"] == fx.t_handoff.isoformat()


def test_the_trainer_refuses_a_plan_whose_files_differ_from_its_snapshot(fx: SamplesFixture) -> None:
    from slipstream.pipeline.runplan import read_plan
    from trainers.config.plan import load_plan_config
    from trainers.train import run

    path = _planned(fx, "daily-20261103-edit0001")
    edited = dataclasses.replace(read_plan(path), files=read_plan(path).files[1:])  # one file dropped by hand
    write_plan(edited)
    plan, cfg = load_plan_config(path, None, SMALL, fx.settings)
    with pytest.raises(PlanError, match="only in the snapshot"):
        run(cfg, fx.settings, plan=plan, plan_file=path)
    assert not (path.parent / "checkpoint").exists()  # refused before training anything


def test_without_a_plan_the_trainer_plans_and_writes_one(fx: SamplesFixture) -> None:
    from slipstream.pipeline.runplan import read_plan
    from trainers.config.schema import load_config
    from trainers.train import run

    sets = [f"data.snapshot_id={fx.snapshot_id}", f"data.t_handoff={fx.t_handoff.isoformat()}", "data.window_days=2",
            "data.stream=false", "data.batch_size=64", "run.run_id=cfg-only", *SMALL]
    cfg = load_config(None, sets, fx.settings)
    run(cfg, fx.settings)
    plan = read_plan(cfg.run.run_dir / "plan.json")
    assert plan.snapshot_id == fx.snapshot_id and plan.t_handoff == fx.t_handoff and plan.request is None
    # the same run id with other data is refused rather than resumed onto another window
    other = load_config(None, [s if not s.startswith("data.window_days") else "data.window_days=1" for s in sets], fx.settings)
    with pytest.raises(PlanError, match="plans other data than this config"):
        run(other, fx.settings)
