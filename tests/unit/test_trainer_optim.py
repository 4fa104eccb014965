"""The optimizer across phases: two parameter groups, the stream phase's learning rates, an exact
resume of the optimizer state, and the DAG's knob defaults matching the trainer's config."""

from __future__ import annotations

import copy
from datetime import date
from pathlib import Path

import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F

from slipstream.datagen import GeneratorConfig, reference_samples
from slipstream.errors import ConfigError
from slipstream.jobspec import KNOBS_BY_NAME
from slipstream.settings import Settings
from trainers.config import DataConfig, ModelConfig, OptimConfig, load_config
from trainers.model import ID_TABLES, build_model, build_optimizer, param_groups, phase_lrs, set_lrs
from trainers.rows import Features, Rows


@pytest.fixture(scope="module")
def feats() -> Features:
    cfg = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=300, seed=5)
    table: pa.Table = next(iter(reference_samples(cfg).values()))
    return Features.from_rows(Rows.from_arrow(table, source=0))


def _model() -> torch.nn.Module:
    return build_model(ModelConfig(user_buckets=101, item_buckets=53, category_buckets=11, embed_dim=4), seed=0)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, f: Features) -> None:
    loss = F.binary_cross_entropy_with_logits(model(f), f.label)
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_every_parameter_is_in_exactly_one_named_group() -> None:
    model = _model()
    groups = param_groups(model)  # type: ignore[arg-type]
    assert [g["name"] for g in groups] == ["ids", "shared"]
    seen = [id(p) for g in groups for p in g["params"]]  # type: ignore[attr-defined]
    assert sorted(seen) == sorted(id(p) for p in model.parameters())
    ids = {id(p) for n, p in model.named_parameters() if n.split(".")[0] in ID_TABLES}
    assert {id(p) for p in groups[0]["params"]} == ids and len(ids) == 4  # type: ignore[attr-defined]


def test_the_stream_phase_raises_the_shared_rate_and_keeps_the_id_tables_per_sample_rate() -> None:
    opt = build_optimizer(_model(), "adam", 0.003, 0.0)  # type: ignore[arg-type]
    rates = lambda: {g["name"]: g["lr"] for g in opt.param_groups}  # noqa: E731
    set_lrs(opt, phase_lrs(0.003, 0.01, 1024, 128, "batch"))
    assert rates() == {"ids": 0.003, "shared": 0.003}
    set_lrs(opt, phase_lrs(0.003, 0.01, 1024, 128, "stream"))
    assert rates() == pytest.approx({"ids": 0.003 / 8, "shared": 0.01})
    set_lrs(opt, phase_lrs(0.003, 0.0, 1024, 4096, "stream"))  # 0: lr; never above lr for the ids
    assert rates() == {"ids": 0.003, "shared": 0.003}


def test_a_resumed_optimizer_takes_exactly_the_same_steps(feats: Features) -> None:
    model = _model()
    opt = build_optimizer(model, "adam", 0.003, 0.0)  # type: ignore[arg-type]
    _step(model, opt, feats)
    set_lrs(opt, phase_lrs(0.003, 0.01, 1024, 128, "stream"))
    _step(model, opt, feats)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    for _ in range(2):
        _step(model, opt, feats)

    resumed = _model()
    resumed.load_state_dict(saved_model)
    ropt = build_optimizer(resumed, "adam", 0.003, 0.0)  # type: ignore[arg-type]
    ropt.load_state_dict(saved_opt)
    set_lrs(ropt, phase_lrs(0.003, 0.01, 1024, 128, "stream"))  # what Trainer.resume does after loading
    for _ in range(2):
        _step(resumed, ropt, feats)
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_stream_knobs_are_validated_with_their_dotted_names(tmp_path: Path) -> None:
    base = ["data.snapshot_id=1", "data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=r"]
    with pytest.raises(ConfigError, match="data.stream_batch_size"):
        load_config(None, [*base, "data.stream_batch_size=0"], Settings(home=tmp_path))
    with pytest.raises(ConfigError, match="optim.stream_lr"):
        load_config(None, [*base, "optim.stream_lr=-0.1"], Settings(home=tmp_path))


def test_the_dag_knob_defaults_are_the_trainer_defaults() -> None:
    # a run launched from the DAG with untouched params trains like `python -m trainers.train`
    trainer = {"epochs": DataConfig.epochs, "batch_size": DataConfig.batch_size,
               "replay_share": DataConfig.replay_share, "lr": OptimConfig.lr}
    assert {k: KNOBS_BY_NAME[k].default for k in trainer} == trainer
