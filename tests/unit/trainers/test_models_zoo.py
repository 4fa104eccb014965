"""The model zoo and a user's model (`model.class`) on every shipped spec's generated data: each
builds from the spec alone, takes the rows as a KeyedJaggedTensor plus a dense tensor, and learns
(its held-out AUC on the generator's data rises well above chance in a few hundred steps)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F

from slipstream.dev.specgen import SpecGenConfig, generate_spec
from slipstream.errors import ConfigError
from slipstream.samples.spec import Spec, load_spec
from slipstream.scoring import auc
from trainers.config.schema import MODEL_KINDS, ModelConfig
from trainers.data.rows import Features, RowLayout, Rows
from trainers.models import RecModel, build_model
from trainers.optim.groups import build_optimizer

SPECS = ("synthetic", "criteo", "ratings")


class TinyUserModel(RecModel):
    """A user's model as docs/trainer.md shows it: the mean of the feature vectors, one linear layer."""

    def __init__(self, spec: Spec, cfg: ModelConfig) -> None:
        super().__init__(spec, cfg, first_order=True)
        self.out = torch.nn.Linear(cfg.embed_dim + self.n_dense, 1)

    def logits(self, dense: torch.Tensor | None, emb: dict[str, torch.Tensor]) -> torch.Tensor:
        pooled = torch.stack([emb[k] for k in self.tables.keys], dim=1).mean(dim=1)
        return self.out(torch.cat([pooled] + ([dense] if dense is not None else []), dim=1)).squeeze(1)


@pytest.fixture(scope="module", params=SPECS)
def data(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Spec, Rows, Rows, float]:
    spec = load_spec(request.param)
    cfg = SpecGenConfig(start_day=date(2026, 11, 1), days=2, events_per_day=4_000, users=300, items=80, seed=3)
    gen = generate_spec(spec, cfg, tmp_path_factory.mktemp(request.param))
    table: pa.Table = pa.concat_tables(gen.batch.values())
    layout = RowLayout.from_spec(spec)
    rows = Rows.from_arrow(table, layout, source=0)
    cut = int(len(rows) * 0.8)
    return spec, rows.slice(0, cut), rows.slice(cut, len(rows)), float(gen.best_auc["holdout_before_t"])


def _small_tables(spec: Spec) -> dict[str, int]:
    # the generator's populations are a few hundred ids: small tables keep the optimizer's steps cheap
    return {f.name: 1009 for f in spec.features if f.is_sparse or (f.is_list and f.shares is None)}


def _train(model: RecModel, train: Rows, steps: int = 60, batch: int = 256) -> None:
    opt = build_optimizer(model, "adam", 0.03, 0.0, id_weight_decay=0.0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        f = Features.from_rows(train.take(rng.integers(0, len(train), batch)))
        loss = F.binary_cross_entropy_with_logits(model(f), f.label)
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("kind", [*MODEL_KINDS, "class"])
def test_every_model_learns_every_spec(kind: str, data: tuple[Spec, Rows, Rows, float]) -> None:
    spec, train, held_out, best = data
    cfg = ModelConfig(embed_dim=8, top_mlp=[32], bottom_mlp=[16], cross_layers=2, buckets=_small_tables(spec),
                      **({"class_path": f"{__name__}:TinyUserModel"} if kind == "class" else {"kind": kind}))
    model = build_model(spec, cfg, seed=0)
    held = Features.from_rows(held_out)
    with torch.no_grad():
        before = auc(held.label.numpy(), model(held).numpy())
    _train(model, train)
    with torch.no_grad():
        after = auc(held.label.numpy(), model(held).numpy())
    # a tenth of the way from chance to the generator's best achievable AUC (and up from the start), in 60 steps
    assert after > max(before + 0.03, 0.5 + 0.1 * (best - 0.5)), (spec.name, kind, before, after, best)


def test_the_sparse_input_is_one_jagged_tensor_with_ids_in_their_tables(data: tuple[Spec, Rows, Rows, float]) -> None:
    spec, train, _, _ = data
    model = build_model(spec, ModelConfig(buckets={f.name: 7 for f in spec.sparse}), seed=0)
    rows = train.slice(0, 50)
    kjt = model.tables.kjt(Features.from_rows(rows))
    assert kjt.keys() == [f.name for f in spec.sparse] + [f.name for f in spec.lists]
    per_key = kjt.to_dict()
    for j, f in enumerate(spec.sparse):
        assert per_key[f.name].lengths().tolist() == [1] * 50
        # a hashed table's row is the id modulo its rows; a managed one's comes from its map, where
        # nobody has a row yet in a fresh model: every id is on the shared row 0
        want = np.zeros(50, dtype=np.int64) if f.managed is not None else np.remainder(rows.sparse[:, j], 7)
        assert per_key[f.name].values().tolist() == want.tolist()
    for j, f in enumerate(spec.lists):
        assert per_key[f.name].lengths().tolist() == np.diff(rows.list_offsets[j]).tolist()


def test_a_model_class_that_cannot_be_used_is_refused_with_its_name() -> None:
    spec = load_spec("synthetic")
    with pytest.raises(ConfigError, match="no_such_module"):
        build_model(spec, ModelConfig(class_path="no_such_module:Model"), seed=0)
    with pytest.raises(ConfigError, match="not a subclass"):
        build_model(spec, ModelConfig(class_path="torch.nn:Linear"), seed=0)


def test_model_class_is_the_config_key_class(tmp_path: Path) -> None:
    from slipstream.settings import Settings
    from trainers.config.schema import load_config

    base = ["data.snapshot_id=1", "data.t_handoff=2026-11-03T00:00:00+00:00", "run.run_id=r"]
    cfg = load_config(None, [*base, f"model.class={__name__}:TinyUserModel"], Settings(home=tmp_path))
    assert cfg.model.class_path == f"{__name__}:TinyUserModel"
    with pytest.raises(ConfigError, match="model.kind"):
        load_config(None, [*base, "model.kind=xgboost"], Settings(home=tmp_path))


def test_tables_get_sparse_gradients_and_a_sparse_optimizer_moves_only_the_touched_rows(
        data: tuple[Spec, Rows, Rows, float]) -> None:
    """What travels between ranks is a table's touched rows (sparse gradients: DDP's sparse
    all-reduce); `optim.table_optimizer=sparse_adam` steps only those rows."""
    spec, train, _, _ = data
    model = build_model(spec, ModelConfig(embed_dim=4, buckets=_small_tables(spec)), seed=0)
    opt = build_optimizer(model, "adam", 0.01, 0.0, id_weight_decay=None, tables="sparse_adam")
    f = Features.from_rows(train.slice(0, 64))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if ".embedding_bags." in n}
    F.binary_cross_entropy_with_logits(model(f), f.label).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if n in before and p.grad is not None}
    assert grads and all(g.is_sparse for g in grads.values())
    touched = {n: torch.zeros(p.shape[0], dtype=torch.bool).index_fill_(0, g.coalesce().indices()[0], True)
               for n, p, g in ((n, before[n], g) for n, g in grads.items())}
    opt.step()
    for n, p in model.named_parameters():
        if n in touched:
            moved = (p.detach() != before[n]).any(dim=1)
            assert bool(moved[~touched[n]].any()) is False, n
            assert bool(moved[touched[n]].any()), n
