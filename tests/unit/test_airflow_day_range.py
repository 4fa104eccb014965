"""`preprocess_samples`'s range params: parsed once into the days, the run id and the gate window."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from slipstream.errors import ConfigError
from slipstream_airflow.data_tasks import DayRange

DAY = date(2026, 11, 5)


def test_without_range_params_a_run_builds_its_own_day() -> None:
    span = DayRange.of_run(DAY, {"range_from": None, "range_to": None, "attribution_s": 3600})
    assert span.days == [DAY]
    assert span.run_id() == "preprocess-20261105"


def test_a_range_names_every_day_once_and_its_window() -> None:
    span = DayRange.of_run(DAY, {"range_from": "2025-12-30", "range_to": "2026-01-02"})
    assert span.days == [date(2025, 12, 30), date(2025, 12, 31), date(2026, 1, 1), date(2026, 1, 2)]
    assert span.run_id() == "preprocess-20251230-20260102"
    assert span.window() == (datetime(2025, 12, 30, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC))


@pytest.mark.parametrize("params, match", [
    ({"range_from": "2026-01-02"}, "both range_from and range_to"),
    ({"range_from": "2026-01-02", "range_to": "2026-01-01"}, "after range_to"),
    ({"range_from": "yesterday", "range_to": "2026-01-01"}, "must be days"),
])
def test_a_bad_range_is_refused_naming_the_param(params: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DayRange.of_run(DAY, params)
