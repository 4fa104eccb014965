"""The generator's day-to-day traffic: bursty volume and users, an outage day, a doubled label
rate, and a drift that moves one feature from its day on."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

from slipstream.dev.specgen import SpecGenConfig, generate_spec
from slipstream.dev.traffic import Drift, Traffic
from slipstream.errors import ConfigError
from slipstream.samples.spec import load_spec

START = date(2026, 1, 5)  # a Monday


def test_bursty_volume_is_repeatable_weekday_shaped_and_an_outage_is_a_tenth() -> None:
    t = Traffic.bursty(volume_days={START + timedelta(days=9): 0.1})
    days = [START + timedelta(days=k) for k in range(28)]
    vols = [t.volume(d, 4000, seed=3) for d in days]
    assert vols == [t.volume(d, 4000, seed=3) for d in days]  # from the seed and the day
    assert len(set(vols)) > 20 and max(vols) / min(v for i, v in enumerate(vols) if i != 9) > 2  # it moves
    assert vols[9] == round(4000 * t.weekly[days[9].weekday()] * 0.1)  # a tenth of the weekday's normal
    weekend = np.median([v for d, v in zip(days, vols) if d.weekday() >= 5])
    weekdays = np.median([v for i, (d, v) in enumerate(zip(days, vols)) if d.weekday() < 5 and i != 9])
    assert weekend < weekdays


def test_bad_traffic_is_refused() -> None:
    with pytest.raises(ConfigError, match="burst_share"):
        Traffic(burst_share=(0.5, 0.2))
    with pytest.raises(ConfigError, match="weekly"):
        Traffic(weekly=(1.0,) * 6)
    with pytest.raises(ConfigError, match="share of x"):
        Drift("x", START, share=1.5)


def test_a_ratings_world_with_bursty_users_an_outage_a_label_fault_and_a_drift(tmp_path: Path) -> None:
    spec = load_spec("ratings")
    outage, labels, moved = START + timedelta(days=6), START + timedelta(days=7), START + timedelta(days=4)
    traffic = Traffic.bursty(volume_days={outage: 0.1}, label_days={labels: 1.6}, drifts=(Drift("year", moved),))
    cfg = SpecGenConfig(start_day=START, days=9, events_per_day=3000, seed=5, traffic=traffic)
    data = generate_spec(spec, cfg, tmp_path)
    days = {date.fromisoformat(k): t for k, t in data.batch.items()}
    assert days[outage].num_rows == round(3000 * traffic.weekly[outage.weekday()] * 0.1)
    # bursty users: on every day a few users make a share of the rows no user has in a steady world
    top3 = [sum(sorted(pc.value_counts(t.column("user_id")).field("counts").to_pylist())[-3:]) / t.num_rows
            for d, t in days.items() if d != outage]
    assert min(top3) > 0.04 and max(top3) > 0.3
    rates = {d: pc.mean(t.column("label")).as_py() for d, t in days.items()}
    usual = np.median([r for d, r in rates.items() if d != labels])
    assert rates[labels] > 1.4 * usual  # the labelling fault
    # the drift: the items that carry recent years get more events from its day on
    year = {d: float(pc.mean(t.column("year")).as_py()) for d, t in days.items()}
    before = [year[d] for d in days if d < moved]
    assert min(year[d] for d in days if d >= moved and d != outage) > max(before)
