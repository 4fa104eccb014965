"""The quality tables stay small however many gates have written to them, and lose no row."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from slipstream.lake.iceberg import get_catalog
from slipstream.quality import store
from slipstream.quality.profiles import FeatureProfile
from slipstream.quality.suites import CheckResult
from slipstream.settings import Settings


def _results(run: int, n: int = 4) -> list[CheckResult]:
    return [CheckResult(f"check_{i}", "error", i != run % n, f"obs-{run}-{i}", "exp", "d") for i in range(n)]


def _files(table: object) -> int:
    snap = table.current_snapshot()  # type: ignore[attr-defined]
    return int(snap.summary.additional_properties["total-data-files"])


def test_results_are_compacted_without_losing_or_repeating_a_row(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "COMPACT_ABOVE_FILES", 5)
    monkeypatch.setattr(store, "KEEP_SNAPSHOTS", timedelta(0))
    catalog = get_catalog(settings)
    for run in range(23):
        store.write_results(catalog, settings.namespace, run_id=f"run-{run}", scope="day:2026-11-01",
                            day=date(2026, 11, 1), snapshot_id=run, results=_results(run))
    # a re-run of one gate still replaces its rows after compaction
    store.write_results(catalog, settings.namespace, run_id="run-3", scope="day:2026-11-01",
                        day=date(2026, 11, 1), snapshot_id=99, results=_results(3, n=2))
    table = store.results_table(catalog, settings.namespace)
    assert _files(table) <= 6
    assert len(table.snapshots()) <= 7  # older snapshots expired at each compaction
    rows = store.read_results(catalog, settings.namespace).to_pylist()
    assert len(rows) == 22 * 4 + 2
    by_run = {}
    for r in rows:
        by_run.setdefault(r["run_id"], []).append((r["expectation"], r["observed"], r["snapshot_id"]))
    assert sorted(by_run["run-3"]) == [("check_0", "obs-3-0", 99), ("check_1", "obs-3-1", 99)]
    for run in (0, 7, 22):
        assert sorted(by_run[f"run-{run}"]) == [(f"check_{i}", f"obs-{run}-{i}", run) for i in range(4)]
    assert store.read_results(catalog, settings.namespace, "run-7").num_rows == 4


def test_profiles_are_compacted_and_all_days_read_back(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "COMPACT_ABOVE_FILES", 3)
    catalog = get_catalog(settings)
    days = [date(2026, 10, 1) + timedelta(days=i) for i in range(9)]
    for i, d in enumerate(days):
        store.write_profile(catalog, settings.namespace, day=d, snapshot_id=i, run_id=f"p-{i}",
                            profile=FeatureProfile(rows=100 + i))
    table = store.profiles_table(catalog, settings.namespace)
    assert _files(table) <= 4
    assert len(table.snapshots()) > 9  # kept: none is older than 7 days
    got = store.read_profiles(catalog, settings.namespace, days[0], days[-1] + timedelta(days=1))
    assert {d: p.rows for d, p in got.items()} == {d: 100 + i for i, d in enumerate(days)}


def test_small_tables_are_left_alone(settings: Settings) -> None:
    catalog = get_catalog(settings)
    store.write_results(catalog, settings.namespace, run_id="r", scope="window:a/b", day=None, snapshot_id=1, results=_results(0))
    table = store.results_table(catalog, settings.namespace)
    assert not store.compact(table)
    assert _files(table) == 1 and len(table.snapshots()) == 1


def test_a_range_of_profiles_is_one_write_and_replaces_only_its_days(settings: Settings) -> None:
    catalog = get_catalog(settings)
    days = [date(2026, 1, 1) + timedelta(days=i) for i in range(200)]
    store.write_profile(catalog, settings.namespace, day=days[0] - timedelta(days=1), snapshot_id=1, run_id="old",
                        profile=FeatureProfile(rows=7))
    table = store.profiles_table(catalog, settings.namespace)
    before = len(table.snapshots())
    assert store.write_profiles(catalog, settings.namespace, {d: FeatureProfile(rows=i) for i, d in enumerate(days)},
                                snapshot_id=2, run_id="range") == 200
    table.refresh()
    assert len(table.snapshots()) == before + 1
    # a re-run of part of the range replaces those days only
    store.write_profiles(catalog, settings.namespace, {d: FeatureProfile(rows=1000) for d in days[:5]}, snapshot_id=3,
                         run_id="again")
    got = store.read_profiles(catalog, settings.namespace, days[0] - timedelta(days=1), days[-1] + timedelta(days=1))
    assert len(got) == 201
    assert got[days[0] - timedelta(days=1)].rows == 7
    assert [got[d].rows for d in days[:6]] == [1000] * 5 + [5]
    assert got[days[-1]].rows == 199
