"""The optimizer across phases: two parameter groups, the stream phase's learning rates, an exact
resume of the optimizer state, and the DAG's knob defaults matching the trainer's config."""

from __future__ import annotations

import copy
import io
import json
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.errors import ConfigError
from slipstream.pipeline.request import KNOBS_BY_NAME
from slipstream.samples.schema import DEFAULT_SPEC
from slipstream.settings import Settings
from trainers.config.schema import DataConfig, ModelConfig, OptimConfig, load_config
from trainers.optim.drift_gauge import DriftGauge
from trainers.optim.groups import build_optimizer, is_id_param, param_groups, phase_lrs, set_lrs
from trainers.models import build_model
from tests.trainer_fixtures import SMALL_BUCKETS
from trainers.data.rows import Features, Rows


@pytest.fixture(scope="module")
def feats() -> Features:
    cfg = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=300, seed=5)
    table: pa.Table = next(iter(reference_samples(cfg).values()))
    return Features.from_rows(Rows.from_arrow(table, source=0))


def _model() -> torch.nn.Module:
    return build_model(DEFAULT_SPEC, ModelConfig(buckets=SMALL_BUCKETS, embed_dim=4), seed=0)


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
    ids = {id(p) for n, p in model.named_parameters() if is_id_param(model, n)}  # type: ignore[arg-type]
    names = sorted(n for n, p in model.named_parameters() if is_id_param(model, n))  # type: ignore[arg-type]
    assert names == ["tables.biases.embedding_bags.item_id.weight", "tables.biases.embedding_bags.user_id.weight",
                     "tables.vectors.embedding_bags.item_id.weight", "tables.vectors.embedding_bags.user_id.weight"]
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


def test_the_tables_own_optimizer_runs_at_table_lr(tmp_path: Path) -> None:
    """`optim.table_lr`: the sparse table optimizer's groups at table_lr (scaled per phase as the
    ids' rate is), the dense part at lr; refused where the tables have no optimizer of their own."""
    opt = build_optimizer(_model(), "adam", 0.003, 0.0, tables="adagrad")  # type: ignore[arg-type]
    set_lrs(opt, phase_lrs(0.003, 0.02, 1024, 128, "batch"), 0.05 / 0.003)  # type: ignore[arg-type]
    rates = [(g.get("tables", False), g["name"], round(g["lr"], 6)) for g in opt.param_groups]
    assert sorted(set(rates)) == [(False, "shared", 0.003), (True, "ids", 0.05), (True, "shared", 0.05)]
    set_lrs(opt, phase_lrs(0.003, 0.02, 1024, 128, "stream", drift=0.0), 0.05 / 0.003)  # type: ignore[arg-type]
    ids = next(g["lr"] for g in opt.param_groups if g.get("tables") and g["name"] == "ids")
    assert ids == pytest.approx(0.05 * 128 / 1024)  # per sample, as the ids' rate
    base = ["data.snapshot_id=1", "data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=r"]
    assert load_config(None, [*base, "optim.table_optimizer=adagrad", "optim.table_lr=0.05"],
                       Settings(home=tmp_path)).optim.table_lr == 0.05
    with pytest.raises(ConfigError, match="optim.table_lr.*table_optimizer"):
        load_config(None, [*base, "optim.table_lr=0.05"], Settings(home=tmp_path))


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


def test_the_shared_stream_rate_follows_the_drift_level_between_the_per_sample_rate_and_stream_lr() -> None:
    per_sample = 0.003 * 128 / 1024
    assert phase_lrs(0.003, 0.01, 1024, 128, "stream", drift=0.0) == pytest.approx({"ids": per_sample, "shared": per_sample})
    assert phase_lrs(0.003, 0.01, 1024, 128, "stream", drift=1.0) == pytest.approx({"ids": per_sample, "shared": 0.01})
    half = phase_lrs(0.003, 0.01, 1024, 128, "stream", drift=0.5)["shared"]
    assert half == pytest.approx((per_sample + 0.01) / 2)
    assert phase_lrs(0.003, 0.01, 1024, 128, "batch", drift=1.0) == {"ids": 0.003, "shared": 0.003}


def _feed(gauge: DriftGauge, fresh_loss: float, replay_loss: float, steps: int, seed: int = 0) -> None:
    # a stream batch of 128: 102 fresh rows, 26 replayed; per-row losses scatter like a CTR model's
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        f, r = rng.exponential(fresh_loss, 102), rng.exponential(replay_loss, 26)
        gauge.update(float(f.sum()), 102.0, float(r.sum()), 26.0)


def test_the_drift_gauge_stays_low_on_stationary_data_and_rises_under_drift() -> None:
    stationary, drifted = DriftGauge(window_rows=2048, low=0.1, high=0.3), DriftGauge(window_rows=2048, low=0.1, high=0.3)
    assert stationary.level == 0.0  # nothing seen yet: the stream only adds samples
    _feed(stationary, 0.40, 0.39, steps=80)  # fresh rows are unseen: a few % higher
    _feed(drifted, 0.55, 0.39, steps=80)  # the click model changed: ~40 % higher
    assert stationary.level < 0.3 and drifted.level == 1.0, (stationary, drifted)
    # within a few hundred fresh rows of a change the rate is already moving up
    late = DriftGauge(window_rows=2048, low=0.1, high=0.3)
    _feed(late, 0.55, 0.39, steps=5)
    assert late.level > 0.5, late


def test_the_drift_gauge_ignores_steps_without_both_kinds_of_rows_and_resumes_exactly() -> None:
    gauge = DriftGauge(window_rows=2048, low=0.1, high=0.3)
    _feed(gauge, 0.5, 0.4, steps=7)
    before = gauge.state_dict()
    gauge.update(10.0, 20.0, 0.0, 0.0)  # no replayed rows on any rank: no comparison
    gauge.update(0.0, 0.0, 5.0, 10.0)
    assert gauge.state_dict() == before
    resumed = DriftGauge(window_rows=2048, low=0.1, high=0.3)
    resumed.load_state_dict(json.loads(json.dumps(before)))  # the checkpoint's meta.json
    _feed(gauge, 0.5, 0.4, steps=3, seed=1)
    _feed(resumed, 0.5, 0.4, steps=3, seed=1)
    assert resumed.state_dict() == gauge.state_dict() and resumed.level == gauge.level


def test_drift_bounds_are_validated_with_their_dotted_names(tmp_path: Path) -> None:
    base = ["data.snapshot_id=1", "data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=r"]
    with pytest.raises(ConfigError, match="optim.drift_low"):
        load_config(None, [*base, "optim.drift_low=0.3", "optim.drift_high=0.1"], Settings(home=tmp_path))
    with pytest.raises(ConfigError, match="optim.drift_window_rows"):
        load_config(None, [*base, "optim.drift_window_rows=0"], Settings(home=tmp_path))


def test_the_id_tables_have_their_own_weight_decay_and_it_shrinks_unseen_rows(feats: Features) -> None:
    model = _model()
    opt = build_optimizer(model, "adam", 0.003, 0.0, id_weight_decay=1e-4)  # type: ignore[arg-type]
    assert {g["name"]: g["weight_decay"] for g in opt.param_groups} == {"ids": 1e-4, "shared": 0.0}
    assert {g["name"]: g["weight_decay"] for g in build_optimizer(_model(), "adam", 0.003, 0.01).param_groups} == \
        {"ids": 0.01, "shared": 0.01}  # type: ignore[arg-type]
    user = model.tables.vectors.embedding_bags["user_id"].weight  # type: ignore[index,union-attr]
    unseen = torch.ones(user.shape[0], dtype=torch.bool)
    unseen[torch.remainder(feats.sparse[:, 0], user.shape[0])] = False
    start = user.detach()[unseen].norm()
    for _ in range(5):
        _step(model, opt, feats)
    assert user.detach()[unseen].norm() < start  # a prior pulls ids without data toward 0


def _feed_kinds(gauge: DriftGauge, fresh: tuple[float, float], replay: tuple[float, float], new_share: tuple[float, float],
                steps: int, seed: int = 0) -> None:
    # per step 102 fresh and 26 replayed rows; a share of each are new users, whose loss is higher
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        sums = []
        for k in (0, 1):
            nf = 102 * (new_share[0] if k else 1 - new_share[0])
            nr = 26 * (new_share[1] if k else 1 - new_share[1])
            f, r = rng.exponential(fresh[k], max(int(nf), 1)), rng.exponential(replay[k], max(int(nr), 1))
            sums.append((float(f.sum()), float(len(f)), float(r.sum()), float(len(r))))
        gauge.update_kinds(sums)


def test_the_drift_gauge_does_not_read_cold_start_as_drift() -> None:
    """Half the stream's rows are new users (their loss is higher whatever the click model does),
    a tenth of the replayed rows are: compared kind with kind, that is no drift; pooled it was."""
    cold = DriftGauge(window_rows=2048, low=0.1, high=0.3)
    _feed_kinds(cold, fresh=(0.40, 0.60), replay=(0.39, 0.59), new_share=(0.5, 0.1), steps=120)
    pooled = (0.5 * 0.40 + 0.5 * 0.60) / (0.9 * 0.39 + 0.1 * 0.59) - 1  # what one average per side reads
    # (a few new users' rows per step are replayed: their average is noisy, the level still 0)
    assert pooled > 0.2 and cold.level == 0.0 and cold.excess < 0.12, (pooled, cold)
    assert cold.new_share == pytest.approx(0.5, abs=0.05)
    drifted = DriftGauge(window_rows=2048, low=0.1, high=0.3)
    _feed_kinds(drifted, fresh=(0.56, 0.80), replay=(0.39, 0.59), new_share=(0.5, 0.1), steps=120)
    assert drifted.level == 1.0, drifted


def test_known_users_mark_what_the_batch_phase_trained_and_survive_a_checkpoint() -> None:
    from slipstream.samples.spec import load_spec
    from trainers.optim.known_users import KNOWN, NEW, KnownUsers
    from trainers.data.rows import RowLayout

    known = KnownUsers(DEFAULT_SPEC, {"user_id": 101})
    col = RowLayout.from_spec(DEFAULT_SPEC).sparse.index("user_id")
    trained = np.zeros((3, len(DEFAULT_SPEC.sparse)), dtype=np.int64)
    trained[:, col] = [5, 7, 107]  # 107 lands in bucket 6
    known.mark(trained)
    fresh = np.zeros((4, len(DEFAULT_SPEC.sparse)), dtype=np.int64)
    fresh[:, col] = [5, 6, 8, 208]  # 208 is bucket 6 too
    assert known.kinds(fresh).tolist() == [KNOWN, KNOWN, NEW, KNOWN] and known.count == 3
    state = torch.load(_saved(known.state_dict()), weights_only=True)  # through the checkpoint's model file
    back = KnownUsers(DEFAULT_SPEC, {"user_id": 101})
    back.load_state_dict(state)
    assert (back.bits == known.bits).all()
    resized = KnownUsers(DEFAULT_SPEC, {"user_id": 211})
    resized.load_state_dict(state)  # another table size: start empty, every user new
    assert resized.count == 0
    criteo = load_spec("criteo")  # no id with role user: one kind of row
    assert criteo.with_role("user") is None
    assert KnownUsers(criteo, None).kinds(np.zeros((2, len(criteo.sparse)), dtype=np.int64)).tolist() == [KNOWN, KNOWN]


def _saved(state: dict) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf
