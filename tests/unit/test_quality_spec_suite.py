"""The quality suite, the profiles' column kinds and the gate's bounds all follow the feature spec."""

from __future__ import annotations

from datetime import date, timedelta

import numpy as np
import pyarrow as pa
import pytest

from slipstream.errors import ConfigError
from slipstream.quality.bounds import (
    Bound,
    GateBounds,
    GateOverrides,
    Learned,
    expected_rows,
    learn_bounds,
    resolve_bounds,
)
from slipstream.quality.config import GateConfig
from slipstream.quality.drift import drift_features
from slipstream.quality.profiles import column_kinds, profile_table
from slipstream.quality.suites import Check, build_checks
from slipstream.samples.spec import QualitySpec, load_spec

OPEN = GateBounds(Bound(None, None), Bound(None, None))


def _checks(name: str, bounds: GateBounds = OPEN, metrics: dict[str, float] | None = None) -> dict[str, Check]:
    spec = load_spec(name)
    return {c.name: c for c in build_checks(GateConfig(), {"row_count": 10.0, **(metrics or {})}, spec, bounds)}


def test_criteo_suite_has_an_expectation_per_feature() -> None:
    checks = _checks("criteo")
    for i in range(1, 14):
        assert {f"finite.i{i}", f"range.min.i{i}", f"range.max.i{i}", f"not_null.i{i}"} <= set(checks)
    assert checks["range.max.i3"].max_value == 1.0 and checks["range.min.i3"].min_value == 0.0  # clip [0, 16] / 16
    for i in range(1, 27):
        assert f"distinct.c{i}" in checks and f"not_null.c{i}" in checks
    assert (checks["distinct.c7"].min_value, checks["distinct.c7"].max_value) == (2, 10007)  # its buckets
    assert not [n for n in checks if n.startswith("sequence.")]  # criteo has no sequence
    assert not [n for n in checks if n.startswith(("range.min.user", "range.min.item", "distinct.device"))]
    assert {"schema", "rows.nonempty", "label.binary", "unique.sample_id", "event_time.in_interval"} <= set(checks)


def test_ratings_suite_checks_its_sequence_ids_and_side_table_features() -> None:
    checks = _checks("ratings")
    seq = checks["sequence.max_length.hist_items"]
    assert (seq.metric, seq.max_value) == ("max_length.hist_items", 20)
    assert checks["sequence.empty_fraction.hist_items"].severity == "warning"
    assert checks["range.min.user_id"].min_value == 0 and checks["range.min.item_id"].min_value == 0  # raw integer ids
    lo = checks["range.min.year"].min_value  # clip [1900, 2030] / 2030, as the float32 the column stores
    assert lo == float(np.float32(1900 / 2030)) and checks["range.max.year"].max_value == 1.0
    assert checks["distinct.gender"].max_value == 17
    assert "not_null.genres" in checks and not [n for n in checks if n.endswith(".genres") and n.startswith("sequence.")]


def test_synthetic_suite_keeps_its_named_bounds_and_severities() -> None:
    checks = _checks("synthetic", resolve_bounds(load_spec("synthetic").quality, Learned(), GateOverrides()))
    assert checks["distinct.device_hash"].max_value == 64  # quality.max_distinct
    assert checks["distinct.device_hash"].severity == "warning"
    assert (checks["ctr"].min_value, checks["ctr"].max_value) == (0.005, 0.6)
    assert (checks["row_count.vs_expected"].min_value, checks["row_count.vs_expected"].max_value) == (0.15, 10.0)
    assert checks["ctr"].bounds_from == "spec"


def test_string_ids_are_hashed_so_they_get_no_sign_check() -> None:
    spec = load_spec("synthetic")
    doc = spec.to_dict()
    doc["sources"]["impressions"]["fields"]["user_id"] = {"type": "string"}
    from slipstream.samples.spec import spec_from_dict

    checks = {c.name for c in build_checks(GateConfig(), {"row_count": 1.0}, spec_from_dict(doc), OPEN)}
    assert "range.min.item_id" in checks and "range.min.user_id" not in checks


def test_drift_checks_score_by_the_feature_kind_within_the_day_s_own_limit() -> None:
    metrics = {"drift.year": 0.1, "drift.gender": 0.05, "drift.hist_items": 0.01, "drift.label": 0.0,
               "drift_limit.year": 0.31, "drift_limit.gender": 0.07, "drift_limit.hist_items": 0.02, "drift_limit.label": 0.05}
    checks = _checks("ratings", metrics=metrics)
    assert checks["drift.year"].max_value == 0.31 and "PSI" in checks["drift.year"].description
    assert checks["drift.gender"].max_value == 0.07 and "Jensen" in checks["drift.gender"].description
    assert checks["drift.hist_items"].max_value == 0.02
    assert "usual day-to-day movement" in checks["drift.year"].description
    assert not [n for n in checks if n.startswith("drift_limit")]
    assert drift_features(load_spec("ratings")) == ("gender", "age", "occupation", "genres", "year", "hist_items", "label")


def test_profile_kinds_come_from_the_spec() -> None:
    spec = load_spec("ratings")
    kinds = column_kinds(spec)
    assert kinds["user_id"] == "id" and kinds["gender"] == "categorical" and kinds["year"] == "numeric"
    assert kinds["genres"] == kinds["hist_items"] == "sequence" and kinds["label"] == "numeric"
    # an int64 column named like nothing the default spec knows is profiled as the spec says
    table = pa.table({"user_id": pa.array([5, 6, 6], pa.int64()), "age": pa.array([20, 30, 30], pa.int64()),
                      "label": pa.array([0, 1, 1], pa.int32())})
    prof = profile_table(table, spec)
    assert prof.columns["user_id"].kind == "id" and prof.columns["user_id"].topk is None
    assert prof.columns["age"].kind == "categorical" and prof.columns["age"].distinct() == 2
    assert prof.ctr == pytest.approx(2 / 3)
    crit = profile_table(pa.table({"c3": pa.array([1, 2], pa.int64()), "i3": pa.array([0.5, 0.25], pa.float32())}),
                         load_spec("criteo"))
    assert crit.columns["c3"].kind == "categorical" and crit.columns["i3"].kind == "numeric"


# --- bounds: learned from the history, and who wins -------------------------------------------

DAY = date(2026, 12, 1)


def _history(days: int, rows: list[int] | None = None,
             ctrs: list[float] | None = None) -> tuple[dict[date, int], dict[date, float]]:
    """`days` days before DAY: rows and CTRs cycling through the given values."""
    rows = rows or [1000]
    ctrs = ctrs or [0.1]
    counts = {DAY - timedelta(days=k): rows[k % len(rows)] for k in range(1, days + 1)}
    rates = {DAY - timedelta(days=k): ctrs[k % len(ctrs)] for k in range(1, days + 1)}
    return counts, rates


def test_expected_rows_skip_days_without_data_and_fall_back_to_the_trailing_median() -> None:
    q = QualitySpec(learn_from_days=28, history_days=7)
    counts = {DAY - timedelta(days=k): n for k, n in ((1, 100), (2, 300), (4, 400), (9, 9))}
    exp = expected_rows(q, GateConfig(), counts, DAY)  # 4 days: too few to learn from
    assert exp is not None and exp.rows == 300 and exp.log_spread is None
    assert "median of the 3 trailing days" in exp.how
    assert expected_rows(q, GateConfig(), {}, DAY) is None


def test_learned_row_bounds_let_bursty_days_pass_and_stop_an_outage() -> None:
    from slipstream.dev.traffic import Traffic

    # bursty volume as the generator draws it: ±35 % from day to day, quiet weekends, spike days
    traffic = Traffic.bursty()
    q = QualitySpec(row_count_ratio_min=0.15, row_count_ratio_max=10.0, learn_from_days=28)
    cfg = GateConfig()
    blocked = outages_missed = days = 0
    for seed in range(20):
        counts = {DAY - timedelta(days=k): traffic.volume(DAY - timedelta(days=k), 4000, seed) for k in range(0, 50)}
        for d in sorted(counts)[28:]:  # four weeks of history before each
            exp = expected_rows(q, cfg, counts, d)
            learned = learn_bounds(q, cfg, counts, {}, d)
            assert exp is not None and learned.row_count_ratio is not None
            b = resolve_bounds(q, learned, GateOverrides()).row_count_ratio
            assert b.lo is not None and b.hi is not None
            days += 1
            blocked += not b.lo <= counts[d] / exp.rows <= b.hi
            outage = 0.1 * 4000 * traffic.weekly[d.weekday()]
            outages_missed += outage / exp.rows >= b.lo
    assert days == 440
    assert blocked / days <= 0.01  # bursty days pass
    assert outages_missed == 0  # a day at 10 % of its weekday's normal volume never does


def test_learned_label_rate_bounds_widen_for_small_days_and_catch_a_doubled_rate() -> None:
    rng = np.random.default_rng(5)
    counts = {DAY - timedelta(days=k): 4000 for k in range(1, 29)}
    rates = {d: float(rng.binomial(n, 0.1) / n) for d, n in counts.items()}
    q = QualitySpec(ctr_min=0.001, ctr_max=0.9, learn_from_days=28)
    big = learn_bounds(q, GateConfig(), counts, rates, DAY, rows=4000).ctr
    small = learn_bounds(q, GateConfig(), counts, rates, DAY, rows=100).ctr
    assert big is not None and small is not None and big[2] == 28
    assert big[0] < 0.1 < big[1] and big[1] < 0.2  # twice the label rate fails
    assert small[1] - small[0] > big[1] - big[0]  # 100 rows: a wider interval, not an alarm


def test_weekday_levels_are_learned_when_the_history_shows_them() -> None:
    weekly = [1.0, 1.0, 1.0, 1.0, 1.0, 0.4, 0.4]  # quiet weekends
    counts = {DAY - timedelta(days=k): int(4000 * weekly[(DAY - timedelta(days=k)).weekday()] * (1 + 0.02 * (k % 3)))
              for k in range(1, 29)}
    q = QualitySpec(learn_from_days=28)
    saturday = next(DAY + timedelta(days=k) for k in range(7) if (DAY + timedelta(days=k)).weekday() == 5)
    monday = next(DAY + timedelta(days=k) for k in range(7) if (DAY + timedelta(days=k)).weekday() == 0)
    sat = expected_rows(q, GateConfig(), counts, saturday)
    mon = expected_rows(q, GateConfig(), counts, monday)
    assert sat is not None and mon is not None
    assert sat.rows < 0.5 * mon.rows and "Saturdays" in sat.how


def test_too_short_a_history_learns_nothing_and_the_spec_holds() -> None:
    q = QualitySpec(ctr_min=0.01, ctr_max=0.6, learn_from_days=28)
    counts, rates = _history(5)
    learned = learn_bounds(q, GateConfig(), counts, rates, DAY)
    assert learned == Learned()
    b = resolve_bounds(q, learned, GateOverrides())
    assert (b.ctr.lo, b.ctr.hi, b.ctr.sources) == (0.01, 0.6, "spec")
    assert learn_bounds(QualitySpec(learn_from_days=0), GateConfig(), *_history(40), DAY) == Learned()


def test_precedence_param_over_learned_over_spec() -> None:
    q = QualitySpec(ctr_min=0.01, ctr_max=0.6, row_count_ratio_min=0.5, row_count_ratio_max=2.0)
    learned = Learned(ctr=(0.07, 0.15, 21), row_count_ratio=(0.2, 1.4, 21))
    b = resolve_bounds(q, learned, GateOverrides(ctr_max=0.12))
    assert (b.ctr.lo, b.ctr.lo_from) == (0.07, "learned from 21 days")
    assert (b.ctr.hi, b.ctr.hi_from) == (0.12, "param gate_ctr_max")
    assert b.ctr.sources == "min: learned from 21 days, max: param gate_ctr_max"
    # learning tightens the spec's bounds, never loosens them: 0.2 is kept at the spec's 0.5
    assert (b.row_count_ratio.lo, b.row_count_ratio.hi) == (0.5, 1.4)
    # a param may loosen past the spec
    wide = resolve_bounds(q, learned, GateOverrides(rows_ratio_min=0.05, rows_ratio_max=5.0))
    assert (wide.row_count_ratio.lo, wide.row_count_ratio.hi) == (0.05, 5.0)
    assert wide.row_count_ratio.sources == "min: param gate_rows_ratio_min, max: param gate_rows_ratio_max"
    # no spec bound, nothing learned, no param: the end is open
    open_end = resolve_bounds(QualitySpec(ctr_max=0.5), Learned(), GateOverrides())
    assert (open_end.ctr.lo, open_end.ctr.lo_from, open_end.ctr.hi_from) == (None, "none", "spec")


def test_crossed_bounds_and_bad_overrides_are_named() -> None:
    q = QualitySpec(ctr_min=0.01, ctr_max=0.6)
    crossed = r"ctr bounds cross: min 0.07 \(learned from 21 days\) > max 0.05 \(param gate_ctr_max\)"
    with pytest.raises(ConfigError, match=crossed):
        resolve_bounds(q, Learned(ctr=(0.07, 0.15, 21)), GateOverrides(ctr_max=0.05))
    with pytest.raises(ConfigError, match="gate_ctr_min must be < gate_ctr_max"):
        GateOverrides(ctr_min=0.3, ctr_max=0.2)


def test_overrides_from_params_or_a_request() -> None:
    from slipstream.pipeline.request import TrainRequest

    assert GateOverrides.from_params({"gate_ctr_max": 0.2, "epochs": 3}) == GateOverrides(ctr_max=0.2)
    assert GateOverrides.from_params(TrainRequest(gate_rows_ratio_min=0.1)) == GateOverrides(rows_ratio_min=0.1)
    assert GateOverrides.from_params(None) == GateOverrides()


def test_the_data_set_sets_severities_and_code_can_still_override() -> None:
    from slipstream.samples.spec import spec_from_dict

    doc = load_spec("criteo").to_dict()
    doc["quality"]["severity"] = {"ctr": "warning", "drift.": "critical"}
    spec = spec_from_dict(doc)
    bounds = resolve_bounds(spec.quality, Learned(), GateOverrides())
    checks = {c.name: c for c in build_checks(GateConfig(), {"row_count": 1.0, "drift.i1": 0.0}, spec, bounds)}
    assert checks["ctr"].severity == "warning" and checks["drift.i1"].severity == "critical"
    assert checks["distinct.c1"].severity == "warning"  # the default
    mine = {c.name: c for c in build_checks(GateConfig(severity={"ctr": "critical"}), {"row_count": 1.0}, spec, bounds)}
    assert mine["ctr"].severity == "critical"
