"""Which days a daily run preprocesses: its own day plus the window's missing days."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from slipstream.errors import ConfigError
from slipstream.lake.retrain_plan import days_present, days_to_preprocess, plan_days, window_days


def test_window_days_end_exclusive() -> None:
    end = datetime(2025, 1, 4, tzinfo=UTC)
    assert window_days(end, 3) == [date(2025, 1, 1), date(2025, 1, 2), date(2025, 1, 3)]
    with pytest.raises(ConfigError, match="window_days must be >= 1"):
        window_days(end, 0)


def test_interval_day_plus_missing() -> None:
    window = [date(2025, 1, d) for d in (1, 2, 3)]
    assert days_to_preprocess(date(2025, 1, 3), window, {date(2025, 1, 2), date(2025, 1, 3)}) == [date(2025, 1, 1), date(2025, 1, 3)]
    assert days_to_preprocess(date(2025, 1, 3), window, set(window)) == [date(2025, 1, 3)]


def test_plan_reads_day_partitions_of_a_real_table(catalog, settings) -> None:  # type: ignore[no-untyped-def]
    from slipstream.dev.datagen import GeneratorConfig, reference_samples
    from slipstream.lake.iceberg import samples_table

    table = samples_table(catalog, settings.namespace)
    assert days_present(table) == set()
    for tbl in reference_samples(GeneratorConfig(start_day=date(2025, 1, 1), days=2, impressions_per_day=200)).values():
        table.append(tbl)
    table = table.refresh()
    assert days_present(table) == {date(2025, 1, 1), date(2025, 1, 2)}
    start, end = datetime(2025, 1, 3, tzinfo=UTC), datetime(2025, 1, 4, tzinfo=UTC)
    assert plan_days(table, start, end, 4) == [date(2024, 12, 31), date(2025, 1, 3)]
