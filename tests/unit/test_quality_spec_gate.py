"""The gate over generated Criteo- and ratings-layout days (real SQLite Iceberg catalog): the
spec's suite passes on good data, learned bounds and a run's DAG params decide the CTR check with
a message naming the bounds' source, and a day without data in the window is a warning the report
shows."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from slipstream.dev.specgen import SpecGenConfig, generate_spec
from slipstream.errors import QualityGateFailed
from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.pipeline.datasets import DatasetRef, dataset_refs
from slipstream.quality.bounds import GateOverrides
from slipstream.quality.config import GateConfig
from slipstream.quality.gate import run_gate
from slipstream.quality.profiles import profile_table
from slipstream.quality.store import read_results, write_profile
from slipstream.samples.spec import Spec, load_spec
from slipstream.settings import Settings

START = date(2026, 11, 1)
DAYS = 10
LAST = START + timedelta(days=DAYS - 1)
FAST = GateConfig(data_docs=False)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, pa.Table]]:
    """Each spec's generated days, exactly as preprocessing makes them (ratings with an empty day)."""
    out = {}
    for name, empty in (("criteo", ()), ("ratings", (START + timedelta(days=6),))):
        cfg = SpecGenConfig(start_day=START, days=DAYS, events_per_day=2000, stream_minutes=0, empty_days=empty)
        data = generate_spec(load_spec(name), cfg, tmp_path_factory.mktemp(name) / "raw")
        out[name] = {k: t for k, t in data.batch.items() if t.num_rows}
    return out


def _spec_settings(settings: Settings, name: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("SLIPSTREAM_SPEC", name)
    return Settings.from_env()


def _dataset() -> DatasetRef:
    """The data set SLIPSTREAM_SPEC names (what a DAG file of it passes its tasks)."""
    return dataset_refs()[0]


def _fill(settings: Settings, spec: Spec, days: dict[str, pa.Table], profiles_until: date | None = LAST) -> int:
    """The days in `samples` (one commit each), stored profiles of the days before `profiles_until`."""
    catalog = get_catalog(settings)
    table = samples_table(catalog, settings.namespace, spec)
    for _, t in sorted(days.items()):
        table.append(t)
    snap = table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    for key, t in days.items():
        d = date.fromisoformat(key)
        if profiles_until is not None and d < profiles_until:
            write_profile(catalog, settings.namespace, day=d, snapshot_id=snap, run_id="seed", profile=profile_table(t, spec))
    return snap


def _with_ctr(t: pa.Table, ctr: float) -> pa.Table:
    labels = (np.random.default_rng(1).random(t.num_rows) < ctr).astype(np.int32)
    return t.set_column(t.schema.get_field_index("label"), "label", pa.array(labels, pa.int32()))


@pytest.mark.parametrize("name", ["criteo", "ratings"])
def test_generated_day_passes_the_spec_suite(settings: Settings, monkeypatch: pytest.MonkeyPatch,
                                             generated: dict[str, dict[str, pa.Table]], name: str) -> None:
    settings = _spec_settings(settings, name, monkeypatch)
    spec = load_spec(name)
    snap = _fill(settings, spec, generated[name])
    res = run_gate(settings, spec=spec, day=LAST, window=None, snapshot_id=snap, run_id=f"gen-{name}", config=FAST)
    assert res.passed, res.to_dict()["critical_failures"]
    by_name = {r.name: r for r in res.results}
    want = {"criteo": ["range.max.i3", "finite.i13", "distinct.c7", "not_null.c26"],
            "ratings": ["sequence.max_length.hist_items", "range.min.user_id", "range.min.year", "distinct.gender"]}[name]
    for check in want:
        assert by_name[check].success, by_name[check].line()
    assert not [n for n in by_name if n.startswith("sequence.")] if name == "criteo" else True
    assert {s.feature for s in res.drift} >= {f.name for f in spec.features if f.kind != "id"}
    # the history (9 days of row counts and stored CTRs) is long enough to learn both bounds
    bounds = res.to_dict()["bounds"]
    assert bounds["ctr"]["max_from"].startswith("learned from") and bounds["row_count_ratio"]["min_from"].startswith("learned from")
    assert bounds["ctr"]["min"] >= spec.quality.ctr_min and bounds["ctr"]["max"] <= spec.quality.ctr_max
    assert "learned from" in by_name["ctr"].expected


def test_learned_bounds_stop_a_day_the_spec_lets_pass_and_a_param_lets_it_through(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, generated: dict[str, dict[str, pa.Table]]
) -> None:
    settings = _spec_settings(settings, "criteo", monkeypatch)
    spec = load_spec("criteo")
    days = dict(generated["criteo"])
    days[str(LAST)] = _with_ctr(days[str(LAST)], 0.45)  # history ~0.25; the spec allows up to 0.6
    snap = _fill(settings, spec, days)
    with pytest.raises(QualityGateFailed) as exc:
        run_gate(settings, spec=spec, day=LAST, window=None, snapshot_id=snap, run_id="learned", config=FAST)
    line = next(ln.strip() for ln in str(exc.value).splitlines() if ln.strip().startswith("ctr "))
    assert line.startswith("ctr [critical]: observed 0.4") and line.endswith("] (learned from 9 days)"), line
    assert "gate_ctr_min/max" in str(exc.value)  # the message says how to relax it for a run

    res = run_gate(settings, spec=spec, day=LAST, window=None, snapshot_id=snap, run_id="param", config=FAST,
                   overrides=GateOverrides(ctr_max=0.6))
    assert res.passed
    assert res.bounds is not None and (res.bounds.ctr.hi, res.bounds.ctr.hi_from) == (0.6, "param gate_ctr_max")
    stored = {r["expectation"]: r for r in read_results(get_catalog(settings), settings.namespace, "param").to_pylist()}
    assert stored["ctr"]["success"] and "param gate_ctr_max" in stored["ctr"]["expected"]


def _plan(settings: Settings, request: Any, run_id: str, t_handoff: datetime) -> dict[str, str]:
    from slipstream.pipeline.runplan import plan_request, write_plan
    from slipstream_airflow.jobxcom import PlanRef

    table = samples_table(get_catalog(settings), settings.namespace)
    plan = plan_request(settings, table, run_id=run_id, request=request, t_handoff=t_handoff, cache_dir=str(settings.cache_dir))
    return PlanRef(str(write_plan(plan))).to_xcom()


def test_dag_param_stops_a_window_the_learned_bounds_let_pass(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, generated: dict[str, dict[str, pa.Table]]
) -> None:
    from slipstream.pipeline.request import TrainRequest
    from slipstream_airflow import tasks

    settings = _spec_settings(settings, "criteo", monkeypatch)
    snap = _fill(settings, load_spec("criteo"), generated["criteo"])
    assert snap
    t = datetime(LAST.year, LAST.month, LAST.day, tzinfo=UTC) + timedelta(days=1)
    out = tasks.quality_gate(_plan(settings, TrainRequest.from_params({"window_days": 1}), "daily-learned", t), _dataset())
    assert out["passed"] is True
    # the same window, with the DAG param gate_ctr_max under its CTR (~0.24): the run stops
    xcom = _plan(settings, TrainRequest.from_params({"window_days": 1, "gate_ctr_max": 0.2}), "daily-param", t)
    with pytest.raises(QualityGateFailed) as exc:
        tasks.quality_gate(xcom, _dataset())
    line = next(ln.strip() for ln in str(exc.value).splitlines() if ln.strip().startswith("ctr "))
    assert line.startswith("ctr [critical]: observed 0.2"), line
    assert "0.2] (min: learned from 9 days, max: param gate_ctr_max)" in line, line


def test_empty_day_in_the_window_is_a_warning_the_report_shows(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, generated: dict[str, dict[str, pa.Table]]
) -> None:
    from slipstream.pipeline.request import TrainRequest
    from slipstream.quality.report import render_report
    from slipstream_airflow import tasks

    settings = _spec_settings(settings, "ratings", monkeypatch)
    days = generated["ratings"]
    empty = START + timedelta(days=6)
    assert str(empty) not in days and len(days) == DAYS - 1
    _fill(settings, load_spec("ratings"), days, profiles_until=None)
    t = datetime(LAST.year, LAST.month, LAST.day, tzinfo=UTC) + timedelta(days=1)
    out = tasks.quality_gate(_plan(settings, TrainRequest.from_params({"window_days": DAYS}), "daily-gap", t), _dataset())
    assert out["passed"] is True
    results = {r["expectation"]: r for r in read_results(get_catalog(settings), settings.namespace, "daily-gap").to_pylist()}
    gap = results["days.nonempty"]
    assert (gap["success"], gap["severity"]) == (False, "warning")
    assert gap["observed"] == f"1 (days without data: {empty})"
    assert [k for k, r in results.items() if not r["success"]] == ["days.nonempty"]

    html = render_report(settings, "daily-gap").read_text()
    assert f"days without data: {empty}" in html
    for feature in ("gender", "genres", "hist_items", "year"):  # drift over the spec's own features
        assert feature in html, feature


def test_day_gate_takes_its_dag_params_and_skips_a_day_without_data(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, generated: dict[str, dict[str, pa.Table]]
) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from slipstream_airflow import data_tasks

    settings = _spec_settings(settings, "criteo", monkeypatch)
    snap = _fill(settings, load_spec("criteo"), generated["criteo"])
    pre = {"day": str(LAST), "snapshot_id": snap, "rows": 2000, "rejects": 0, "empty": False}
    out = data_tasks.gate_day(LAST, pre, _dataset(), {"attribution_s": 3600, "gate_ctr_max": None})
    assert out["passed"] and out["bounds"]["ctr"]["max_from"] == "learned from 9 days"
    with pytest.raises(QualityGateFailed, match=r"ctr \[critical\]: .*\(min: learned from 9 days, max: param gate_ctr_max\)"):
        data_tasks.gate_day(LAST, pre, _dataset(), {"gate_ctr_max": 0.2})
    with pytest.raises(AirflowSkipException, match="2026-11-11 had no raw events"):
        data_tasks.gate_day(LAST + timedelta(days=1), {"day": "2026-11-11", "snapshot_id": None, "rows": 0, "empty": True},
                           _dataset())


def test_a_feature_added_to_the_spec_does_not_fail_the_older_days(settings: Settings) -> None:
    # days written before the spec had `price_raw` read it as nulls: they take its default in
    # training, so the window gate across the schema change does not count them as missing
    from slipstream.samples.spec import spec_from_dict
    from tests.quality_fixtures import day_of, reference_days

    old_spec = load_spec("synthetic")
    doc = old_spec.to_dict()
    doc["features"]["price_raw"] = {"kind": "dense", "field": "price", "clip": [0, 100], "scale": 100}
    new_spec = spec_from_dict(doc)
    days = reference_days()
    catalog = get_catalog(settings)
    old_table = samples_table(catalog, settings.namespace, old_spec)
    for i in range(3):
        old_table.append(days[str(day_of(i))])
    table = samples_table(catalog, settings.namespace, new_spec)  # evolves: one column more
    last = days[str(day_of(3))]
    price = pa.array(np.random.default_rng(2).random(last.num_rows).astype(np.float32))
    table.append(last.add_column(last.schema.get_field_index("label"), "price_raw", price))
    snap = table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    start = datetime(day_of(0).year, day_of(0).month, day_of(0).day, tzinfo=UTC)
    res = run_gate(settings, spec=new_spec, day=None, window=(start, start + timedelta(days=4)), snapshot_id=snap,
                   run_id="evolved", config=FAST)
    # the older rows are counted and named (a warning, never a failure): the model sees the default there
    assert res.passed
    assert [(w.name, w.observed) for w in res.warnings] == [("predates.price_raw", "12000")]
    nulls = next(r for r in res.results if r.name == "not_null.price_raw")
    assert nulls.success and nulls.observed == "0 (besides 12,000 rows written before the spec had price_raw (they take its default))"
    assert next(r for r in res.results if r.name == "range.max.price_raw").success
