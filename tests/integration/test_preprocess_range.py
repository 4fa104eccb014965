"""The range job against the day-by-day job on the same raw days (real Spark local, SQLite Iceberg
catalogs): the samples must be equal row for row, read back by pyiceberg (not by the job), and the
rejects, empty days and per-day counts must be the same; the range is one snapshot, and a re-run
replaces it.

Data: the synthetic spec's generator (clicks in the next day's first hour, duplicated impression
lines, bad lines) with one day removed, and the ratings spec's (side tables, hashed ids, an empty
day, bad lines)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from slipstream.dev.datagen import GeneratorConfig, generate
from slipstream.dev.specgen import SpecGenConfig, generate_spec
from slipstream.errors import RejectRateExceeded
from slipstream.lake.iceberg import get_catalog, rejects_table, samples_table
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.samples.spec import Spec, load_spec
from slipstream.settings import Settings
from spark_jobs.day_job import DayOptions, DayResult, preprocess_day
from spark_jobs.range_input import list_range_files
from spark_jobs.range_job import preprocess_range

pytestmark = pytest.mark.integration

START = date(2026, 3, 1)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from spark_jobs.preprocess import start_spark

    session = start_spark(SparkSettings(shuffle_partitions=2), "test-preprocess-range")
    yield session
    session.stop()


def _opts(settings: Settings, spec: Spec, run_id: str, max_reject_rate: float = 0.3) -> DayOptions:
    return DayOptions(spec=spec, raw_dir=settings.raw_dir, namespace=settings.namespace, run_id=run_id,
                      max_reject_rate=max_reject_rate, target_bytes=64 << 20)


def _both(spark: Any, root: Path, raw: Path, spec: Spec, days: list[date]) -> tuple[Settings, Settings, list[DayResult],
                                                                                     list[DayResult]]:
    """The days through the range job and, into another catalog, day by day."""
    by_range, by_day = Settings(home=root / "range", raw_dir=str(raw)), Settings(home=root / "days", raw_dir=str(raw))
    seen: list[DayResult] = []
    ranged = preprocess_range(spark, get_catalog(by_range), _opts(by_range, spec, "r1"), days, None, on_day=seen.append)
    assert sorted(r.day for r in seen) == sorted(r.day for r in ranged)
    catalog = get_catalog(by_day)
    daily = [preprocess_day(spark, catalog, _opts(by_day, spec, "d1"), d) for d in days]
    return by_range, by_day, ranged, daily


def _samples(settings: Settings, spec: Spec) -> pa.Table:
    """Every row of `samples`, read by pyiceberg, in a fixed order."""
    rows = samples_table(get_catalog(settings), settings.namespace, spec).scan().to_arrow()
    return rows.sort_by([("sample_id", "ascending"), ("event_time", "ascending")])


def _rejects(settings: Settings) -> pa.Table:
    rows = rejects_table(get_catalog(settings), settings.namespace).scan(
        selected_fields=("day", "record_kind", "source_file", "reason", "raw_line")).to_arrow()
    return rows.sort_by([(n, "ascending") for n in rows.schema.names])


def test_a_synthetic_range_equals_the_day_by_day_job(spark: Any, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    cfg = GeneratorConfig(start_day=START, days=5, impressions_per_day=300, stream_minutes=1.0, corrupt_fraction=0.05)
    generate(cfg, raw)
    gap = START + timedelta(days=2)
    shutil.rmtree(raw / "impressions" / f"day={gap}")  # a day without events: skipped, nothing committed
    days = [START + timedelta(days=i) for i in range(5)]
    by_range, by_day, ranged, daily = _both(spark, tmp_path, raw, load_spec(), days)

    per_day = {r.day: (r.rows, r.rejects, r.empty) for r in ranged}
    assert per_day == {r.day: (r.rows, r.rejects, r.empty) for r in daily}
    assert per_day[str(gap)] == (0, 0, True)
    assert sum(r.rejects for r in ranged) > 0  # the generator's bad lines were met
    # the clicks of a day's late impressions sit in the next day's first hour: the range reads them once
    assert sum(r.raw_records for r in ranged) <= sum(r.raw_records for r in daily)
    got, want = _samples(by_range, load_spec()), _samples(by_day, load_spec())
    assert got.num_rows == sum(r.rows for r in daily) > 0
    assert got.equals(want)
    assert pc.sum(got.column("label")).as_py() > 0
    assert _rejects(by_range).equals(_rejects(by_day))
    # one snapshot for the whole range; each committed day's result names it
    table = samples_table(get_catalog(by_range), by_range.namespace, load_spec())
    assert len(table.snapshots()) == 1
    assert {r.snapshot_id for r in ranged if not r.empty} == {table.current_snapshot().snapshot_id}
    summary = table.current_snapshot().summary.additional_properties
    assert summary["days"] == f"{days[0]}..{days[-1]}" and summary["day_count"] == "4"

    # a re-run replaces the same days: one more snapshot, the same rows, no file of the first run left
    preprocess_range(spark, get_catalog(by_range), _opts(by_range, load_spec(), "r2"), days, {}, on_day=lambda r: None)
    table.refresh()
    assert len(table.snapshots()) == 2
    assert _samples(by_range, load_spec()).equals(want)
    assert all("r2-" in t.file.file_path for t in table.scan().plan_files())


def test_a_ratings_range_with_side_tables_and_an_empty_day_equals_the_day_by_day_job(spark: Any, tmp_path: Path) -> None:
    spec = load_spec("ratings")
    raw = tmp_path / "raw"
    empty = START + timedelta(days=1)
    generate_spec(spec, SpecGenConfig(start_day=START, days=4, events_per_day=400, empty_days=(empty,),
                                      bad_fraction=0.01, stream_minutes=1.0), str(raw))
    days = [START + timedelta(days=i) for i in range(4)]
    by_range, by_day, ranged, daily = _both(spark, tmp_path, raw, spec, days)
    assert [(r.day, r.rows, r.rejects, r.raw_records, r.empty) for r in ranged] == \
        [(r.day, r.rows, r.rejects, r.raw_records, r.empty) for r in daily]
    assert [r.empty for r in ranged] == [False, True, False, False]
    got = _samples(by_range, spec)
    assert got.num_rows > 0 and got.equals(_samples(by_day, spec))
    assert _rejects(by_range).equals(_rejects(by_day))


def test_a_day_above_the_reject_limit_is_refused_and_the_others_commit(spark: Any, tmp_path: Path) -> None:
    spec = load_spec("ratings")
    raw = tmp_path / "raw"
    generate_spec(spec, SpecGenConfig(start_day=START, days=3, events_per_day=300, stream_minutes=1.0), str(raw))
    bad_day = START + timedelta(days=1)
    folder = raw / "ratings" / f"day={bad_day}" / "hour=07"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part-bad.jsonl").write_text("not json\n" * 60)
    settings = Settings(home=tmp_path / "home", raw_dir=str(raw))
    days = [START + timedelta(days=i) for i in range(3)]
    assert str(folder / "part-bad.jsonl") in list_range_files(spec, str(raw), days, 0, {}).events[bad_day]
    seen: list[DayResult] = []
    with pytest.raises(RejectRateExceeded, match=str(bad_day)) as err:
        preprocess_range(spark, get_catalog(settings), _opts(settings, spec, "r1", max_reject_rate=0.05), days, None,
                         on_day=seen.append)
    assert "part-bad.jsonl" in str(err.value)
    committed = {r.day for r in seen if r.snapshot_id is not None}
    assert committed == {str(days[0]), str(days[2])}
    rows = _samples(settings, spec)
    kept = set(pc.strftime(rows.column("event_time"), format="%Y-%m-%d").to_pylist())
    assert kept == committed
    rejects = _rejects(settings)
    assert pc.count(pc.filter(rejects.column("day"), pc.equal(rejects.column("day"), pa.scalar(bad_day)))).as_py() == 60
