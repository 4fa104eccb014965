"""The Spark job on real-looking files (real Spark local, a SQLite Iceberg catalog), read back by
an independent reader (DuckDB is not needed: pyiceberg's scan of the committed snapshot):

- Avazu's 64-bit ids and YYMMDDHH hours go from `slipstream import` through Spark into `samples`
  exactly (ids beyond int64 as text, no float on the way);
- a `missing: indicator` feature gives the table a 0/1 column that says which values were absent;
- every rejected record in `samples_rejects` names its file and its line (JSON lines read in
  several splits, a blank line counted; Parquet: the row);
- a day whose sample ids already exist in another day is refused before its commit;
- the range job (a backfill) rejects with the same files and lines, and refuses ids that repeat
  within its range or in days outside it, as the one-day job does."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from slipstream.errors import DuplicateSampleIds
from slipstream.lake.iceberg import get_catalog, rejects_table, samples_table
from slipstream.lake.importer import ImportOptions, import_files
from slipstream.pipeline.spark_settings import SparkSettings
from slipstream.samples.schema import source_arrow_schema
from slipstream.samples.spec import Spec, load_spec, spec_from_dict
from slipstream.samples.transform import Featurizer
from slipstream.settings import Settings
from spark_jobs.day_job import DayOptions, DayResult, preprocess_day
from spark_jobs.range_job import preprocess_range
from tests.preprocess_fixtures import impression, ts, write_jsonl

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data" / "import"
UTC = UTC


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from spark_jobs.preprocess import start_spark

    session = start_spark(SparkSettings(shuffle_partitions=2), "test-preprocess-real-files")
    yield session
    session.stop()


def _run(spark: Any, settings: Settings, spec: Spec, day: date, run_id: str, rate: float = 0.5) -> DayResult:
    opts = DayOptions(spec=spec, raw_dir=settings.raw_dir, namespace=settings.namespace, run_id=run_id,
                      max_reject_rate=rate, target_bytes=64 << 20)
    return preprocess_day(spark, get_catalog(settings), opts, day)


def _table(settings: Settings, spec: Spec) -> pa.Table:
    return samples_table(get_catalog(settings), settings.namespace, spec).scan().to_arrow()


def test_avazu_ids_and_hours_reach_the_table_exactly(spark: Any, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    spec = spec_from_dict(yaml.safe_load((DATA / "avazu" / "avazu.yaml").read_text()))
    import_files(spec, [DATA / "avazu" / "train.csv"], ImportOptions(raw_dir=Path(settings.raw_dir)))
    for day in (date(2014, 10, 21), date(2014, 10, 22)):
        assert _run(spark, settings, spec, day, f"avazu-{day}").rejects == 0
    got = _table(settings, spec)
    header, *rows = [line.split(",") for line in (DATA / "avazu" / "train.csv").read_text().splitlines()]
    want = {r[0]: datetime.strptime(r[2], "%y%m%d%H").replace(tzinfo=UTC) for r in rows}
    assert dict(zip(got.column("sample_id").to_pylist(), got.column("event_time").to_pylist())) == want
    assert "10000169349117863715" in want and "1000009418151094273" in want
    assert sorted(got.column("label").to_pylist()) == sorted(int(r[1]) for r in rows)


def test_a_missing_indicator_reaches_the_table(spark: Any, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "specs" / "criteo.yaml").read_text())
    doc["features"]["i12"]["missing"] = "indicator"
    spec = spec_from_dict(doc)
    day = date(2026, 11, 1)
    import_files(spec, [DATA / "criteo" / "day_0.txt"], ImportOptions(raw_dir=Path(settings.raw_dir), day=day))
    assert _run(spark, settings, spec, day, "criteo-1").rows == 5
    got = _table(settings, spec).sort_by("event_time")
    raw = pa.concat_tables(pq.read_table(f) for f in sorted((Path(settings.raw_dir) / "displays").rglob("*.parquet")))
    want = Featurizer(spec).samples(raw.sort_by("ts"))
    assert got.column("i12_missing").to_pylist() == want.column("i12_missing").to_pylist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert got.column("i12").to_pylist() == want.column("i12").to_pylist()


def _files_with_rejects(settings: Settings, spec: Spec, day: date) -> tuple[Path, list[str]]:
    """A day of JSON lines (gzip and plain) and Parquet with 5 bad records; (the plain file, the gzip lines)."""
    raw = Path(settings.raw_dir) / "impressions" / f"day={day}"
    # gzip JSON lines: a blank line (line 2) is no record but counts; bad lines 3 and 5
    gz = raw / "hour=08" / "part-0.jsonl.gz"
    gz.parent.mkdir(parents=True)
    lines = [json.dumps(impression("a-1", ts(day, 8, 0), 1, 10)), "",
             "{not json", json.dumps(impression("a-2", ts(day, 8, 1), 1, 11)),
             json.dumps(impression("a-3", ts(day, 8, 2), 1, 12, price="cheap"))]
    gz.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    # a plain JSON-lines file long enough to be read in several splits: bad lines 7 and 390
    plain = raw / "hour=09" / "part-0.jsonl"
    plain.parent.mkdir(parents=True)
    body = [json.dumps(impression(f"b-{i}", ts(day, 9, i % 60), 2, 20 + i)) for i in range(1, 401)]
    body[6] = json.dumps(impression("b-7", ts(day + timedelta(days=1), 9, 0), 2, 27))  # another day
    body[389] = "[1, 2"
    plain.write_text("\n".join(body) + "\n")
    # Parquet: row 3 holds a NaN price
    pq_rows = [impression(f"c-{i}", ts(day, 10, i), 3, 30 + i) for i in range(1, 5)]
    pq_rows[2]["price"] = float("nan")
    for r in pq_rows:
        r["ts"] = datetime.fromisoformat(r["ts"])
    t = pa.Table.from_pylist(pq_rows, schema=source_arrow_schema(spec.events))
    (raw / "hour=10").mkdir(parents=True)
    pq.write_table(t, raw / "hour=10" / "part-0.parquet")
    return plain, lines


def _range(spark: Any, settings: Settings, spec: Spec, days: list[date], run_id: str) -> list[DayResult]:
    opts = DayOptions(spec=spec, raw_dir=settings.raw_dir, namespace=settings.namespace, run_id=run_id,
                      max_reject_rate=0.5, target_bytes=64 << 20)
    return preprocess_range(spark, get_catalog(settings), opts, days, None, on_day=lambda r: None)


def _rejects_found(settings: Settings) -> list[tuple[str, str, int]]:
    rej = rejects_table(get_catalog(settings), settings.namespace).scan().to_arrow()
    return sorted((Path(f).name, Path(f).parent.name, line) for f, line in zip(rej.column("source_file").to_pylist(),
                                                                               rej.column("line").to_pylist()))


REJECTED_LINES = [("part-0.jsonl", "hour=09", 7), ("part-0.jsonl", "hour=09", 390), ("part-0.jsonl.gz", "hour=08", 3),
                  ("part-0.jsonl.gz", "hour=08", 5), ("part-0.parquet", "hour=10", 3)]


@pytest.mark.parametrize("job", ["day", "range"])
def test_rejects_name_their_file_and_line(spark: Any, tmp_path: Path, job: str) -> None:
    settings = Settings(home=tmp_path / "home")
    spec = load_spec("synthetic")
    day = date(2026, 10, 5)
    plain, lines = _files_with_rejects(settings, spec, day)
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(plain.stat().st_size // 5))
    try:
        res = _run(spark, settings, spec, day, "lines-1") if job == "day" else _range(spark, settings, spec, [day], "r-1")[0]
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert (res.rejects, res.rows, res.raw_records) == (5, 2 + 398 + 3, 4 + 400 + 4)
    assert _rejects_found(settings) == REJECTED_LINES
    rej = rejects_table(get_catalog(settings), settings.namespace).scan().to_arrow()
    cols = (rej.column(c).to_pylist() for c in ("source_file", "line", "raw_line"))
    by_line = {(Path(f).parent.name, n): r for f, n, r in zip(*cols)}
    assert by_line[("hour=09", 390)] == "[1, 2" and by_line[("hour=08", 3)] == "{not json"
    assert lines[4] == by_line[("hour=08", 5)]


def test_a_day_whose_ids_exist_in_another_day_is_refused(spark: Any, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    spec = load_spec("synthetic")
    d1, d2 = date(2026, 10, 7), date(2026, 10, 8)
    raw = Path(settings.raw_dir) / "impressions"
    for d, ids in ((d1, range(1, 5)), (d2, range(3, 7))):
        write_jsonl(raw / f"day={d}" / "hour=10" / "part-0.jsonl.gz", [impression(f"imp-{i}", ts(d, 10, i), 1, i) for i in ids])
    first = _run(spark, settings, spec, d1, "dup-1")
    assert first.rows == 4
    with pytest.raises(DuplicateSampleIds, match=r"day 2026-10-08: 2 of its 4 sample ids already exist in other days of "
                                                 r"\S+: 2026-10-07 \(2\); e.g. imp-3, imp-4\. Nothing was committed"):
        _run(spark, settings, spec, d2, "dup-2")
    table = samples_table(get_catalog(settings), settings.namespace, spec)
    assert table.current_snapshot().snapshot_id == first.snapshot_id  # samples unchanged
    assert sorted(table.scan().to_arrow().column("sample_id").to_pylist()) == [f"imp-{i}" for i in range(1, 5)]
    assert not list((Path(table.location().removeprefix("file://")) / "data" / f"event_time_day={d2}").glob("*.parquet"))
    # (a re-run of a day is no duplicate of itself: test_preprocess_job re-runs days with the same ids)


def test_a_range_whose_ids_repeat_within_it_or_in_other_days_is_refused(spark: Any, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home")
    spec = load_spec("synthetic")
    d1, d2, d3 = date(2026, 10, 7), date(2026, 10, 8), date(2026, 10, 9)
    raw = Path(settings.raw_dir) / "impressions"
    for d, ids in ((d1, range(1, 5)), (d2, range(3, 7)), (d3, range(10, 14))):
        write_jsonl(raw / f"day={d}" / "hour=10" / "part-0.jsonl.gz", [impression(f"imp-{i}", ts(d, 10, i), 1, i) for i in ids])
    # within the range: d2 repeats two of d1's ids
    with pytest.raises(DuplicateSampleIds, match=r"day 2026-10-07, 2026-10-08: 2 of its 8 sample ids already exist in "
                                                 r"other days of \S+: 2026-10-08 \(2\); e.g. imp-3, imp-4\. Nothing"):
        _range(spark, settings, spec, [d1, d2], "dup-r1")
    table = samples_table(get_catalog(settings), settings.namespace, spec)
    assert table.current_snapshot() is None
    assert not list((Path(table.location().removeprefix("file://")) / "data").rglob("*.parquet"))
    # against a day outside the range: d1 committed alone, then a backfill of d2..d3
    first = _range(spark, settings, spec, [d1], "dup-r2")[0]
    assert first.rows == 4
    with pytest.raises(DuplicateSampleIds, match=r"day 2026-10-08, 2026-10-09: 2 of its 8 sample ids already exist in "
                                                 r"other days of \S+: 2026-10-07 \(2\)"):
        _range(spark, settings, spec, [d2, d3], "dup-r3")
    table.refresh()
    assert table.current_snapshot().snapshot_id == first.snapshot_id  # samples unchanged
    assert sorted(table.scan().to_arrow().column("sample_id").to_pylist()) == [f"imp-{i}" for i in range(1, 5)]
    # a re-run of the committed day is no duplicate of itself
    assert _range(spark, settings, spec, [d1], "dup-r4")[0].rows == 4
