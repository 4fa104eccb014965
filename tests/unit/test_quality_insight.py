"""Insight a person can act on: drift and skew that account for sample size and a table's usual
movement, comparable rows between batch and stream, and a report whose every finding has its
numbers, its rows and, when red, what to do."""

from __future__ import annotations

import json
import re
from datetime import date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slipstream.dev.specgen import SpecGenConfig, generate_spec
from slipstream.dev.traffic import Drift, Traffic
from slipstream.lake.iceberg import get_catalog, samples_table
from slipstream.quality.drift import compare_profiles, drift_features
from slipstream.quality.drift_days import drift_over_days, summarise
from slipstream.quality.movement import MovementConfig, chance, distance, limit, usual_movement
from slipstream.quality.profiles import US_PER_HOUR, FeatureProfile, merge_profiles, profile_table
from slipstream.quality.report import render_report
from slipstream.quality.skew import batch_vs_stream, stream_hours
from slipstream.samples.schema import DEFAULT_SPEC, sample_arrow_schema
from slipstream.samples.spec import Spec, load_spec
from slipstream.settings import Settings
from tests.quality_fixtures import reference_days

START = date(2026, 1, 5)


def test_a_small_day_gets_a_wide_limit_and_a_real_change_still_alarms() -> None:
    cfg = MovementConfig()
    rng = np.random.default_rng(1)
    w = 1 / np.arange(1, 31) ** 1.05
    p = w / w.sum()
    ref = rng.multinomial(28_000, p)
    usual = usual_movement([0.002] * 10, cfg)  # a steady table
    small = rng.multinomial(60, p)  # 60 rows of the very same distribution
    assert distance("js", ref, small) > 0.1  # past the old fixed threshold: an alarm by chance alone
    assert distance("js", ref, small) < limit("js", chance("js", ref, small, cfg), usual, cfg)
    moved = p * 0.65
    moved[25] += 0.35  # a rare value takes a third of the rows
    big = rng.multinomial(4000, moved)
    assert distance("js", ref, big) > limit("js", chance("js", ref, big, cfg), usual, cfg)


def _profiles(tables: dict[str, pa.Table], spec: Spec) -> dict[date, FeatureProfile]:
    return {date.fromisoformat(k): profile_table(t, spec) for k, t in tables.items()}


def test_an_injected_drift_alarms_on_its_day_and_only_its_feature(tmp_path: Path) -> None:
    spec = load_spec("criteo")
    moved = START + timedelta(days=7)  # six days before it: enough to know each feature's usual movement
    traffic = Traffic.bursty(burst_share=(0.0, 0.0), drifts=(Drift("c3", moved), Drift("i5", moved)))
    data = generate_spec(spec, SpecGenConfig(start_day=START, days=8, events_per_day=1500, seed=3, traffic=traffic), tmp_path)
    series = drift_over_days(_profiles(data.batch, spec), [moved], spec, spec.quality.history_days)
    assert {s.feature for s in series[moved] if s.drifted} == {"c3", "i5"}
    assert all(s.baseline_days == 6 for s in series[moved])
    line = next(ln for ln in summarise(series, spec) if ln.feature == "c3")
    assert line.text().startswith(f"moved more than usual on 1 of 1 days, since {moved}; furthest on {moved}: JS ")


def _stream_hour(day: pa.Table) -> pa.Table:
    """The first hour after midnight: all a stream that starts at T = midnight covers at first."""
    hours = pc.cast(day.column("event_time"), pa.int64()).to_numpy() // US_PER_HOUR % 24
    return day.filter(pa.array(hours == 0))


def _slices(days: dict[str, pa.Table], spec: Spec) -> dict[tuple[date, int], FeatureProfile]:
    out = {}
    for key, t in days.items():
        t = t.select(["event_time", *drift_features(spec)])
        hours = pc.cast(t.column("event_time"), pa.int64()).to_numpy() // US_PER_HOUR % 24
        for h in range(24):
            out[(date.fromisoformat(key), h)] = profile_table(t.filter(pa.array(hours == h)), spec)
    return out


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_same_day_sequences_are_compared_at_the_same_hours(seed: int) -> None:
    days = reference_days(seed=seed)  # the synthetic demo's generator
    keys = sorted(days)
    window = {k: days[k] for k in keys[:-1]}
    stream = profile_table(_stream_hour(days[keys[-1]]), DEFAULT_SPEC)
    # against whole days, the first hour's short same-day sequences read as skew in every run
    old = compare_profiles(merge_profiles(profile_table(t, DEFAULT_SPEC) for t in window.values()), stream, DEFAULT_SPEC)
    assert "hist_items" in {s.feature for s in old if s.drifted}
    res = batch_vs_stream(_slices(window, DEFAULT_SPEC), stream, DEFAULT_SPEC, stream_hours(stream))
    assert res.hours == frozenset({0}) and res.hours_text() == "00:00-01:00 UTC"
    assert res.skewed == [] and len(res.shifts) == 9


def test_a_real_skew_is_still_flagged() -> None:
    days = reference_days()
    keys = sorted(days)
    hour = _stream_hour(days[keys[-1]])
    broken = hour.set_column(hour.schema.get_field_index("device_hash"), "device_hash",
                             pa.array(np.zeros(hour.num_rows, np.int64)))  # the stream's join lost the device
    stream = profile_table(broken, DEFAULT_SPEC)
    res = batch_vs_stream(_slices({k: days[k] for k in keys[:-1]}, DEFAULT_SPEC), stream, DEFAULT_SPEC, stream_hours(stream))
    assert [s.feature for s in res.skewed] == ["device_hash"]


def _fill(settings: Settings, spec: Spec, tables: dict[str, pa.Table]) -> int:
    table = samples_table(get_catalog(settings), settings.namespace, spec)
    for _, t in sorted(tables.items()):
        table.append(t.cast(sample_arrow_schema(spec)))
    return table.current_snapshot().snapshot_id  # type: ignore[union-attr]


def test_bursty_ratings_show_no_drift_flood_and_no_skew(settings: Settings, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ratings log where 5-60 % of each day comes from three users: as MovieLens does."""
    monkeypatch.setenv("SLIPSTREAM_SPEC", "ratings")
    settings = Settings.from_env()
    spec = load_spec("ratings")
    cfg = SpecGenConfig(start_day=START, days=14, events_per_day=2000, seed=7, traffic=Traffic.bursty())
    data = generate_spec(spec, cfg, tmp_path / "raw")
    snap = _fill(settings, spec, data.batch)
    t = cfg.t_handoff
    stream = data.stream.filter(pc.greater_equal(data.stream.column("event_time"), pa.scalar(t, pa.timestamp("us", tz="UTC"))))
    run = Path(settings.runs_dir) / "bursty"
    run.mkdir(parents=True)
    profile_table(stream, spec).write(run / "stream_profile.json")
    (run / "metrics.json").write_text(json.dumps({"run_id": "bursty", "snapshot_id": snap, "t_handoff": t.isoformat(),
                                                  "window_start": datetime.combine(START, t.timetz()).isoformat()}))
    text = render_report(settings, "bursty").read_text()
    alarmed = sum(int(n) for n in re.findall(r"moved more than usual on (\d+) of \d+ days", text))
    tested = sum(int(n) for n in re.findall(r"(?:of|on all) (\d+) days", text.split('<section id="drift">')[1]))
    assert tested >= 7 * 12
    assert alarmed <= 1  # no flood: at most one feature-day of a hundred
    assert "SKEW" not in text and "Skew: none of 7 features differs" in text
    assert "00:00-01:00 UTC" in text and "hist_items (same-day sequence)" in text
    # the same days against the fixed thresholds: the flood a new user saw on MovieLens
    days = _profiles(data.batch, spec)
    ordered = sorted(days)
    old = sum(s.drifted for i, d in enumerate(ordered[1:], 1)
              for s in compare_profiles(merge_profiles(days[k] for k in ordered[max(0, i - 7):i]), days[d], spec))
    assert old >= 8
