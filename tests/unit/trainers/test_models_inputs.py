"""Model inputs: variable-length histories without padding, rows of an older schema take the defaults."""


from __future__ import annotations

from datetime import date

import numpy as np
import pyarrow as pa
import pytest
import torch

from slipstream.dev.datagen import GeneratorConfig, reference_samples
from slipstream.samples.schema import DEFAULT_SPEC
from tests.trainer_fixtures import SMALL_BUCKETS
from trainers.config.schema import ModelConfig
from trainers.data.rows import Features, Rows
from trainers.models import build_model


@pytest.fixture(scope="module")
def table() -> pa.Table:
    cfg = GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=600, seed=3)
    return next(iter(reference_samples(cfg).values()))


def test_model_consumes_variable_length_histories_without_padding(table: pa.Table) -> None:
    rows = Rows.from_arrow(table.slice(0, 64), source=0)
    lengths = np.diff(rows.list_offsets[0])
    assert lengths.min() == 0 and lengths.max() > 1  # empty and long histories in one batch
    model = build_model(DEFAULT_SPEC, ModelConfig(buckets=SMALL_BUCKETS, embed_dim=4), seed=0)
    out = model(Features.from_rows(rows))
    assert out.shape == (64,) and torch.isfinite(out).all()
    empty = model(Features.from_rows(Rows.empty()))
    assert empty.shape == (0,)


def test_rows_of_an_older_schema_take_the_features_defaults() -> None:
    """A column the spec gained later is null in older snapshots' rows: each takes the feature's
    default through its transform, as a record without the field does, never a cast NaN."""
    from trainers.data.rows import RowLayout

    table = reference_samples(GeneratorConfig(start_day=date(2026, 11, 1), days=1, impressions_per_day=50))["2026-11-01"]
    layout = RowLayout.from_spec(DEFAULT_SPEC)
    j = layout.sparse.index("country_hash")
    nulls = pa.nulls(table.num_rows, pa.int64())
    old = table.set_column(table.schema.get_field_index("country_hash"), "country_hash", nulls)
    old = old.set_column(old.schema.get_field_index("price_log"), "price_log", pa.nulls(table.num_rows, pa.float32()))
    rows = Rows.from_arrow(old, layout, source=0)
    assert (rows.sparse[:, j] == layout.sparse_defaults[j]).all()
    assert (rows.dense[:, layout.dense.index("price_log")] == layout.dense_defaults[layout.dense.index("price_log")]).all()
    fresh = Rows.from_arrow(table, layout, source=0)
    assert (fresh.sparse[:, j] == table.column("country_hash").to_numpy()).all()
