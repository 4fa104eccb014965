"""Rows written before the spec had a feature are counted in the gate's result (a warning that
names the column and the count) and logged, not only mentioned on its page: the model sees the
feature's default there, not a value."""

from __future__ import annotations

import logging

import pytest

from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.quality.config import GateConfig
from slipstream.quality.gate import run_gate
from slipstream.samples.schema import DEFAULT_SPEC as SPEC
from slipstream.samples.spec import spec_from_dict
from slipstream.settings import Settings
from tests.quality_fixtures import day_of, reference_days


def test_rows_from_before_a_feature_are_counted_and_logged(settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    day = day_of(0)
    data = reference_days()[str(day)]
    doc = dict(SPEC.raw)
    older = spec_from_dict({**doc, "features": {k: v for k, v in doc["features"].items() if k != "category_hash"}})
    catalog = get_catalog(settings)
    table = samples_table(catalog, settings.namespace, older)  # the table before the spec had category_hash
    table.append(data.drop_columns(["category_hash"]).cast(table.schema().as_arrow()))
    table = samples_table(catalog, settings.namespace, SPEC)  # the spec gains it: the table evolves
    caplog.set_level(logging.WARNING, "slipstream.quality.gate")
    res = run_gate(settings, spec=SPEC, day=day, window=None, snapshot_id=table.current_snapshot().snapshot_id,
                   run_id="predates", config=GateConfig(data_docs=False))
    check = next(r for r in res.results if r.name == "predates.category_hash")
    assert (check.severity, check.success) == ("warning", False) and check.observed == str(data.num_rows)
    assert res.passed and "predates.category_hash" in {w.name for w in res.warnings}
    assert f"{data.num_rows:,} of {data.num_rows:,} rows were written before the spec had category_hash" in caplog.text
    assert next(r for r in res.results if r.name == "not_null.category_hash").success  # not counted as missing values
